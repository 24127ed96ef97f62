"""Migrating drain (CONTRACT.md §6.1): which of a draining worker's tasks get a replacement
now, which originals may stop, when the deadline has come, and what a drain request changes.

Replacement first, as ECS' ``DRAINING`` (within the service's ``maximumPercent``) and
``nomad node drain`` (``migrate { max_parallel }``) move work: each running task of a
migrating worker that belongs to a service gets one replacement placed elsewhere; its
original stops only once that replacement runs (or at the deadline); at most
``max_surge`` of a service's tasks are migrating at once (replacement placed, not yet
running), so a service holds at most ``desired_count + max_surge`` active tasks while a
drain migrates and ``desired_count`` once it has ended.

Pure functions over values; ``activities/migration.py`` reads the rows and carries out what
these return, inside the fleet monitor's upkeep (every ``HEARTBEAT_INTERVAL``) and the
liveness's drain. Times are timezone-aware UTC ``datetime``s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from reaper.core.contract import WorkerState

REASON_PREFIX = "migrate"
"""The ``replaced`` events row of a migration's replacement starts with this word (§6.1)."""

DRAINED = "drained"
"""``stop_reason`` of an original stopped because its replacement runs (§6.1)."""
DEADLINE = "drain-deadline"
"""``stop_reason`` of a task still on the worker at the drain's deadline (§6.1)."""
UNDRAINED = "undrained"
"""``stop_reason`` of a replacement not yet running when an ``undrain`` ended the drain."""


@dataclass(frozen=True)
class Original:
    """A running task of a migrating worker.

    Attributes:
        task: its id.
        service: its service (``None``: not migrated, stopped at the deadline).
        replacement: the id of its active (``pending`` or ``running``) replacement, if any.
        replacement_running: that replacement runs (its worker reported it).
    """

    task: str
    service: str | None
    replacement: str | None = None
    replacement_running: bool = False

    @property
    def migrating(self) -> bool:
        """Placed and not yet replaced: its replacement is ``pending`` (§6.1)."""
        return self.replacement is not None and not self.replacement_running


@dataclass(frozen=True)
class ServiceLoad:
    """A service's numbers as Postgres holds them.

    Attributes:
        desired: ``desired_count``.
        max_surge: ``max_surge`` (at least 1).
        active: its ``pending`` and ``running`` tasks (owed replacements and originals
            included).
    """

    desired: int
    max_surge: int
    active: int


def surge_left(load: ServiceLoad, migrating: int) -> int:
    """How many more of a service's tasks may start migrating now: ``max_surge`` less those
    migrating, and never past ``desired_count + max_surge`` active tasks (§6.1). Never
    negative."""
    return max(0, min(load.max_surge - migrating, load.desired + load.max_surge - load.active))


def wave(originals: Sequence[Original], services: Mapping[str, ServiceLoad]) -> list[str]:
    """The originals (of every migrating worker) that get a replacement now, in the order
    given (oldest first): per service, those without an active replacement, as many as
    :func:`surge_left` allows. Tasks without a service, or of a service with no row, are
    never migrated (they stop at the deadline).

    Args:
        originals: every running task of every migrating worker, oldest first.
        services: the services those tasks belong to.
    """
    migrating: dict[str, int] = {}
    for o in originals:
        if o.service is not None and o.migrating:
            migrating[o.service] = migrating.get(o.service, 0) + 1
    chosen: list[str] = []
    taken: dict[str, int] = {}
    for o in originals:
        load = services.get(o.service) if o.service is not None else None
        if load is None or o.replacement is not None or o.service is None:
            continue
        if taken.get(o.service, 0) < surge_left(load, migrating.get(o.service, 0)):
            taken[o.service] = taken.get(o.service, 0) + 1
            chosen.append(o.task)
    return chosen


def replaced(originals: Sequence[Original]) -> list[str]:
    """The originals that stop now (``stop_reason`` drained): their replacement runs. A
    running original is never stopped before its replacement runs, except at the deadline."""
    return [o.task for o in originals if o.replacement_running]


def deadline_passed(migrate_until: datetime | None, now: datetime, fleet_full: bool) -> bool:
    """Whether a migrating drain's deadline has come (``now``, UTC): what is still on the
    worker is then stopped and backfilled; like every automatic stop it waits while the fleet
    is in full disruption (rule 6)."""
    return migrate_until is not None and now >= migrate_until and not fleet_full


def starts_migration(migrate: bool, migrate_until: datetime | None, now: datetime) -> bool:
    """Whether a ``drain`` (``migrate``: it asked to move the tasks) starts a migration: one
    with ``migrate`` does if none runs (``migrate_until`` unset or passed, UTC); a second one
    while it runs changes nothing (§6.1)."""
    return migrate and (migrate_until is None or migrate_until <= now)


def return_undrains(recorded: str | None, new: str) -> bool:
    """Whether recording ``new`` over a row in state ``recorded`` is a return from ``lost``,
    which clears ``drained_at`` (§6.2: cleared by an undrain, a return from lost, or a
    retirement); a worker that still drains and holds nothing is drained again afresh."""
    return recorded is not None and (WorkerState(recorded), WorkerState(new)) == (
        WorkerState.lost,
        WorkerState.running,
    )


def deadline_refused(deadline_s: float | None, heartbeat_interval: float) -> str | None:
    """Why a drain's ``deadline`` (seconds; ``None``: the default) is refused, or ``None``:
    at least ``2 x HEARTBEAT_INTERVAL`` (CONTRACT.md §6: ``REAPER_DRAIN_DEADLINE``'s rule)."""
    if deadline_s is not None and deadline_s < 2 * heartbeat_interval:
        return (
            f"deadline {deadline_s:g}s is below 2 x HEARTBEAT_INTERVAL"
            f" ({2 * heartbeat_interval:g}s)"
        )
    return None
