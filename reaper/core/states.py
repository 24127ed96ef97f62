"""Every state a worker, a handle row or a task can be in, each declared once with its meaning.

Policy reads these tables; SQL receives the state sets derived from them as parameters (no
activity spells a state), so adding a state is one row here, a migration for the column's
``CHECK`` and its tests. The names are CONTRACT.md §3's; the meanings follow Kubernetes'
node lifecycle (Ready, Unknown, evicted) and Concourse's container states.

Sets are lists, ready to be passed as ``text[]`` parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from reaper.core import kinds
from reaper.core.contract import WorkerState


@dataclass(frozen=True)
class WorkerMeaning:
    """What a worker state means to every rule.

    Attributes:
        healthy: counted healthy in the disruption fraction (rule 6).
        unhealthy: counted unhealthy in it (stalled or lost workers; rule 6).
        placeable: new work (replacements, owed work) may go to it, unless it drains (rule 5).
        decides: its complete reports mark, clear and destroy (rules 1 and 4).
        clock: its place in the order the liveness's clock moves a worker (``running`` ->
            ``stalled`` -> ``lost``; only a heartbeat moves it back); ``None``: the clock
            never judges a worker in this state.
        holds_tasks: tasks placed on it stay; ``False``: tasks still placed on it (once its
            reap is done) are strays, reaped by the fleet monitor (Kubernetes #12545).
        in_fleet: shown in ``reaper_workers{state}`` and the fleet's views (CONTRACT.md §5.4).
        terminal: its liveness ends; only a new boot registers the worker again (§5.1).
        left_by_a_beat: an accepted heartbeat from a worker in this state is its return to
            ``running`` (``policy.liveness.is_return``; rule 4: its marks restart). A state
            with no ``clock`` that a beat does not leave is held: only a command ends it.
        reapable: it may be reaped, automatically once ``lost`` or by an operator's
            ``force_reap``; ``False``: never, forced or not (``policy.fleet.may_reap``).
    """

    healthy: bool = False
    unhealthy: bool = False
    placeable: bool = False
    decides: bool = False
    clock: int | None = None
    holds_tasks: bool = True
    in_fleet: bool = True
    terminal: bool = False
    left_by_a_beat: bool = True
    reapable: bool = True


WORKERS: Mapping[WorkerState, WorkerMeaning] = {
    WorkerState.running: WorkerMeaning(
        healthy=True, placeable=True, decides=True, clock=0, left_by_a_beat=False
    ),
    WorkerState.stalled: WorkerMeaning(unhealthy=True, clock=1),
    WorkerState.lost: WorkerMeaning(unhealthy=True, clock=2, holds_tasks=False),
    WorkerState.retired: WorkerMeaning(clock=3, holds_tasks=False, in_fleet=False, terminal=True),
}
"""Worker states (``reaper.workers.state``, the ``ReaperState`` search attribute)."""


class HandleState(str, Enum):
    """A container's or volume's row state (CONTRACT.md §3), Concourse's container states."""

    creating = "creating"
    """Being created by the scheduler; never marked missing (rule 2); collected after
    ``CREATING_TIMEOUT`` (its creator crashed)."""
    created = "created"
    destroying = "destroying"


@dataclass(frozen=True)
class HandleMeaning:
    """What a container or volume row state means.

    Attributes:
        markable: may be marked missing by a report that lacks it (rule 2).
        being_created: its creator is still at work: never marked, and failed and collected
            once in the state for ``CREATING_TIMEOUT`` (Concourse fails such containers too).
    """

    markable: bool = False
    being_created: bool = False


HANDLES: Mapping[HandleState, HandleMeaning] = {
    HandleState.creating: HandleMeaning(being_created=True),
    HandleState.created: HandleMeaning(markable=True),
    HandleState.destroying: HandleMeaning(markable=True),
}


class TaskState(str, Enum):
    """A task's state (CONTRACT.md §3)."""

    pending = "pending"
    running = "running"
    lost = "lost"
    stopped = "stopped"


@dataclass(frozen=True)
class TaskMeaning:
    """What a task state means.

    Attributes:
        active: counted in its service's tasks against ``desired_count`` (rule 5; an owed
            replacement, ``pending`` with no worker, counts too, §5.1).
        markable: may be marked missing by a report that lacks it (rule 2).
        starts: becomes ``running`` when its worker reports it (rule 5).
        ended: the task is over: a worker that reports it holds an orphan (rule 7), and a
            replacement may stand in for it.
    """

    active: bool = False
    markable: bool = False
    starts: bool = False
    ended: bool = False


TASKS: Mapping[TaskState, TaskMeaning] = {
    TaskState.pending: TaskMeaning(active=True, starts=True),
    TaskState.running: TaskMeaning(active=True, markable=True),
    TaskState.lost: TaskMeaning(ended=True),
    TaskState.stopped: TaskMeaning(ended=True),
}

# What the controller's verbs make of a task (CONTRACT.md rules 4, 5 and §5.1).
PLACED = TaskState.pending
"""A new task or replacement, placed (or owed) but not started."""
STARTED = TaskState.running
"""A placed task its worker reported."""
REAPED = TaskState.lost
"""A task taken down by a reap, a retirement or as a stray."""
DESTROYED = TaskState.stopped
"""A task missing from its worker's reports for ``MISSING_TTL`` (``stop_reason`` missing)."""

S = TypeVar("S", bound=Enum)
M = TypeVar("M")


def states(table: Mapping[S, M], means: Callable[[M], bool]) -> list[str]:
    """The names of the states of ``table`` whose meaning satisfies ``means``, in table
    order: a ``text[]`` parameter for SQL."""
    return [state.value for state, meaning in table.items() if means(meaning)]


HEALTHY = states(WORKERS, lambda m: m.healthy)
UNHEALTHY = states(WORKERS, lambda m: m.unhealthy)
IN_FLEET = states(WORKERS, lambda m: m.in_fleet)
PLACEABLE = states(WORKERS, lambda m: m.placeable)
DECIDING = states(WORKERS, lambda m: m.decides)
HOLDS_NO_TASKS = states(WORKERS, lambda m: not m.holds_tasks)
TERMINAL = states(WORKERS, lambda m: m.terminal)
NEVER_REAPED = states(WORKERS, lambda m: not m.reapable)
ACTIVE_TASKS = states(TASKS, lambda m: m.active)
ENDED_TASKS = states(TASKS, lambda m: m.ended)
STARTING_TASKS = states(TASKS, lambda m: m.starts)
BEING_CREATED = states(HANDLES, lambda m: m.being_created)

MARKABLE: dict[str, list[str]] = {
    k.report: states(TASKS, lambda m: m.markable)
    if k.task
    else states(HANDLES, lambda m: m.markable)
    for k in kinds.ALL
}
"""Row states a report may mark missing, per report kind (rule 2: never a row being
created, never a ``pending`` task, which its worker has not started yet)."""


def worker(state: WorkerState | str) -> WorkerMeaning:
    """The meaning of a worker state (a ``WorkerState`` or its name).

    Raises:
        ValueError: not a worker state.
    """
    return WORKERS[WorkerState(state)]
