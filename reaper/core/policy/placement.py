"""Placement policy: where replacement tasks go (CONTRACT.md rule 5).
"""

from __future__ import annotations

from typing import Mapping


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
