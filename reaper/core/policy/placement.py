"""Placement policy: where replacement tasks go (CONTRACT.md rule 5)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def place(candidates: Mapping[str, int], count: int) -> list[str]:
    """Pick workers for ``count`` new tasks, each on the one with the fewest running tasks.

    Args:
        candidates: healthy, non-draining worker name -> running (and pending) task count.
        count: number of tasks to place.

    Returns:
        One worker name per task placed (fewer than ``count`` if there are no candidates);
        ties go to the lexically smallest name so placement is deterministic.
    """
    load = dict(candidates)
    chosen: list[str] = []
    for _ in range(count):
        if not load:
            break
        name = min(load, key=lambda w: (load[w], w))
        chosen.append(name)
        load[name] += 1
    return chosen


def deficit(desired: int, active: int, pretend_gone: int = 0) -> int:
    """How many replacements a service needs: never above ``desired_count`` (rule 5).

    Args:
        desired: the service's ``desired_count``.
        active: its ``pending`` and ``running`` tasks.
        pretend_gone: tasks a dry run would have taken down, counted as gone.
    """
    return max(desired - active + pretend_gone, 0)


def place_owed(
    owed: Sequence[tuple[str, str]], candidates: Mapping[str, int]
) -> list[tuple[str, str]]:
    """Place owed replacements, oldest first, each on the least loaded candidate (§5.1).

    Args:
        owed: ``(task_id, service)`` of ``pending`` tasks with no worker, oldest first.
        candidates: placeable worker name -> its pending and running task count.

    Returns:
        ``(task_id, worker)`` for every task placed; none if there are no candidates.
    """
    chosen = place(candidates, len(owed))
    return [(task_id, worker) for (task_id, _), worker in zip(owed, chosen, strict=False)]
