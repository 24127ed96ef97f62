"""Python models of rules whose production form is SQL: only tests call them.

Where a rule must be set-based SQL for speed, the SQL is the rule (Concourse's
``RemoveMissingContainers``), named as a domain verb in ``activities/``; these models state
the same rules row by row, and the tests check that the statements agree with them on random
rows against a real Postgres (tests/activities/test_collection_sql.py,
tests/activities/test_repair_sql.py) and table-test them (tests/policy).

- ``row_verdict``: ``activities/collection_sql.py`` ``MarkStore.mark``/``clear`` (rules 2-3).
- ``may_destroy``: ``collection_sql.REMOVE_MISSING`` with ``policy.collection.destroy_refused``
  and ``destroy_cutoff`` (rule 4).
- ``stuck_creating``: ``collection_sql.FAIL_STUCK_CREATING`` (``CREATING_TIMEOUT``).
- ``is_stray``: ``activities/fleet.py`` ``STRAY_HOSTS`` (Kubernetes #12545).
- ``placeable``: ``activities/tasks.py`` ``placeable_load`` (rule 5, §5.1).
- ``is_suspect``: ``activities/repair.py`` ``SUSPECTS``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import Enum

from reaper.core import states
from reaper.core.contract import WorkerState
from reaper.core.policy.collection import destroy_cutoff, destroy_refused
from reaper.core.policy.fleet import FleetState
from reaper.core.policy.repair import REPAIRABLE_STATES, retire_cutoff, suspect_cutoff
from reaper.core.states import MARKABLE


class RowVerdict(str, Enum):
    """What one complete report does to one of its worker's rows (rules 1-3)."""

    mark = "mark"
    """Absent from the report, markable, not marked yet: ``missing_since`` = ``taken_at``."""
    clear = "clear"
    """Present in the report and marked: ``missing_since`` cleared."""
    keep = "keep"
    """Nothing to write (rule 3: ``missing_since`` is written only when it changes)."""


def row_verdict(
    kind: str,
    row_state: str,
    state_changed_at: datetime,
    marked: bool,
    in_report: bool,
    taken_at: datetime,
) -> RowVerdict:
    """What a deciding complete report does to one row of its worker (rules 2 and 3).

    Args:
        kind: ``containers``, ``volumes`` or ``tasks``.
        row_state: the row's ``state``.
        state_changed_at: when the row's state last changed (UTC).
        marked: the row has a ``missing_since``.
        in_report: the report lists the row's handle.
        taken_at: when the report was received (UTC).

    A reported row is cleared if marked. An absent row is marked only if its state is
    markable and was set no later than ``taken_at`` (a row created or changed after the
    report was taken is not marked on its account: the report could not have known it).
    """
    if in_report:
        return RowVerdict.clear if marked else RowVerdict.keep
    if marked or row_state not in MARKABLE[kind] or state_changed_at > taken_at:
        return RowVerdict.keep
    return RowVerdict.mark


def may_destroy(
    kind: str,
    row_state: str,
    missing_since: datetime | None,
    taken_at: datetime,
    missing_ttl: float,
    worker_state: WorkerState | str | None,
    fleet_full: bool,
) -> bool:
    """Whether a marked row is destroyed on the evidence of a report just reconciled (rule 4).

    Destroyed (container or volume row deleted; task ``stopped`` with ``stop_reason``
    ``missing``) only if: the row is still markable (a row that moved to ``creating`` is
    left alone), it has been missing for at least ``missing_ttl`` by the report's time
    (every complete report since ``missing_since``, including this one, lacked it: any
    report that held it cleared the mark), the worker is ``running`` (rule 4: never on a
    stalled or lost worker's account), and the fleet is not in full disruption (rule 6).

    Args:
        missing_since: the row's mark (UTC), ``None`` if unmarked.
        taken_at: receive time (UTC) of the report just reconciled, which lacked the row.
        missing_ttl: ``REAPER_MISSING_TTL`` in seconds.
        worker_state: the worker's recorded state.
        fleet_full: the fleet is in full disruption.
    """
    if missing_since is None or row_state not in MARKABLE[kind]:
        return False
    if destroy_refused(worker_state, fleet_full) is not None:
        return False
    return missing_since <= destroy_cutoff(kind, taken_at, missing_ttl)


def stuck_creating(
    row_state: str,
    state_changed_at: datetime,
    now: datetime,
    creating_timeout: float,
    fleet_full: bool,
) -> bool:
    """Whether a row left in ``creating`` is collected: its creator crashed.

    A row ``creating`` for ``REAPER_CREATING_TIMEOUT`` seconds or more is deleted with an
    ``events`` row (reason ``creating-timeout``), except in full disruption (rule 6).
    Concourse fails containers stuck in ``creating`` the same way.
    """
    if row_state not in states.BEING_CREATED or fleet_full:
        return False
    return state_changed_at <= now - timedelta(seconds=creating_timeout)


def placeable(worker_state: str, draining: bool) -> bool:
    """Whether new work may go to a worker: ``running`` and not draining (rule 5, §5.1)."""
    return states.worker(worker_state).placeable and not draining


def is_stray(
    task_state: str, worker_state: str | None, reaped: bool, fleet: FleetState | str
) -> bool:
    """Whether a task is reaped as a stray: written ``running`` or ``pending`` onto a worker
    that is already lost and reaped, or retired, by a scheduler with a stale view
    (Kubernetes #12545). Not while the fleet is in full disruption (rule 6)."""
    if task_state not in states.ACTIVE_TASKS or FleetState(fleet) is FleetState.full:
        return False
    if worker_state is None or states.worker(worker_state).holds_tasks:
        return False
    return states.worker(worker_state).terminal or reaped


def is_suspect(
    state: str | None,
    last_heartbeat_at: datetime | None,
    now: datetime,
    heartbeat_interval: float,
    stall_after: float,
    lost_after: float,
    state_since: datetime | None = None,
    retire_after: float | None = None,
) -> bool:
    """Whether a ``workers`` row shows a liveness that should have acted by ``now`` (UTC)
    and has not: state ``running`` or ``stalled`` with a last heartbeat older than
    :func:`suspect_after` (it should have judged the worker lost), or ``lost`` since before
    :func:`retire_cutoff` (it should have retired it). ``activities/repair.py`` selects the
    same rows in SQL.

    Args:
        state: ``workers.state`` (``None``: no row).
        last_heartbeat_at: ``workers.last_heartbeat_at`` (UTC), ``None`` if never set.
        state_since: ``workers.state_since`` (UTC).
        retire_after: ``REAPER_RETIRE_AFTER``, seconds (``None``: lost rows never suspect).
    """
    if state == WorkerState.lost.value:
        if state_since is None or retire_after is None:
            return False
        return state_since < retire_cutoff(now, heartbeat_interval, retire_after)
    if state not in REPAIRABLE_STATES or last_heartbeat_at is None:
        return False
    cutoff = suspect_cutoff(now, heartbeat_interval, stall_after, lost_after)
    return last_heartbeat_at < cutoff
