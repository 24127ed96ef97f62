"""Collection policy: what a complete report marks and clears, and when a handle is destroyed.

CONTRACT.md §4 rules 1-4, after Concourse's ``atc/gc`` (mark ``missing_since``, wait out the
TTL, recheck, destroy). "When is a handle destroyed?" is answered here and in one statement:
:func:`report_decides` (may this report decide anything?), :func:`next_due` (when its
oldest mark falls due, the collector's timer), :func:`destroy_cutoff` and
:func:`destroy_refused` (on a fresh report's evidence, if the worker decides and the fleet
is not fully disrupted), and ``activities/collection_sql.py`` ``REMOVE_MISSING``, the
set-based statement that is the rule for the rows themselves (Concourse's
``RemoveMissingContainers``). Row-by-row models of the SQL live with the tests
(``tests/support/rule_models.py``), which check that the two agree on random rows.

Pure functions over values; times are timezone-aware UTC ``datetime``s, durations seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from reaper.core import kinds, states
from reaper.core.contract import WorkerState


def report_decides(
    worker_state: WorkerState | str | None,
    state_since: datetime | None,
    taken_at: datetime,
) -> str | None:
    """Whether a complete report may mark, clear or destroy anything; ``None`` if it may.

    Rule 1: only a ``running`` worker's report decides. Rule 4: time stalled or lost does
    not count, so a report taken before the worker's latest return to ``running``
    (``state_since``) never decides; the first report after the return does.

    Args:
        worker_state: the worker's recorded state (``None``: unknown worker).
        state_since: when it entered that state (UTC), ``None`` if unknown.
        taken_at: when the controller received the report (UTC).

    Returns:
        ``None`` if the report decides, else the reason it is skipped.
    """
    state = WorkerState(worker_state) if worker_state is not None else None
    if state is None or not states.worker(state).decides:
        return f"worker is {state.value if state else 'unknown'}"
    if state_since is not None and taken_at < state_since:
        return f"report taken before the return at {state_since.isoformat()}"
    return None


def mass_drop_held(
    newly_missing: int,
    held: int,
    max_drop_fraction: float,
    suspect_min_handles: int,
    confirmed: bool,
) -> bool:
    """Whether a report drops so many handles at once that it marks nothing yet.

    A worker whose agent lost its view (a bad mount, a crashed runtime) reports nothing
    while still holding everything; believing it would destroy all of it after one TTL
    (Concourse #2588's "volume not found" in reverse). The drop is believed once a second
    report confirms it, or when the worker rebooted (``confirmed``).

    Args:
        newly_missing: rows this report would mark.
        held: the worker's markable rows of the kind before the report.
        max_drop_fraction: ``REAPER_MAX_DROP_FRACTION`` (default 0.5).
        suspect_min_handles: ``REAPER_SUSPECT_MIN_HANDLES`` (default 10); smaller holdings
            are never held back.
        confirmed: a second report with the same digest, or a new boot id, confirmed it.
    """
    if confirmed or held < suspect_min_handles:
        return False
    return newly_missing > max_drop_fraction * held


def destroy_after(kind: str, missing_ttl: float) -> float:
    """How long a handle of ``kind`` (a report key or word, ``reaper.core.kinds``) must have
    been missing from every complete report before it is destroyed, in seconds: the kind's
    ``ttl_multiple`` of ``MISSING_TTL`` (rule 4: one for every kind). The one place that
    says so: :func:`destroy_cutoff`, :func:`next_due`, the collector's timer, the liveness's
    view, ``reaper explain``, the demo and the chaos checker all ask it.

    Raises:
        KeyError: ``kind`` names no kind.
    """
    return kinds.kind(kind).ttl_multiple * missing_ttl


def destroy_cutoff(kind: str, taken_at: datetime, missing_ttl: float) -> datetime:
    """Rows of ``kind`` marked at or before this time are due on the evidence of a report
    ``taken_at`` (UTC)."""
    return taken_at - timedelta(seconds=destroy_after(kind, missing_ttl))


def destroy_refused(worker_state: WorkerState | str | None, fleet_full: bool) -> str | None:
    """Why nothing of a worker may be destroyed now, or ``None`` if it may (rules 4 and 6).

    A stalled or lost worker's handles are never destroyed on account of missing reports,
    and nothing is destroyed automatically while the fleet is in full disruption.
    """
    state = WorkerState(worker_state) if worker_state is not None else None
    if state is None or not states.worker(state).decides:
        return f"worker is {state.value if state else 'unknown'}"
    if fleet_full:
        return "fleet in full disruption"
    return None


def destroy_retry_due(next_due: datetime, refused_at: datetime, stall_after: float) -> datetime:
    """When a kind whose destroy was refused (:func:`destroy_refused`: the worker stalled or
    lost, the fleet in full disruption) is looked at again (UTC): ``STALL_AFTER`` after the
    refusal, not at every beat (a worker that stalls is judged within that long), and never
    before the kind's own ``next_due``.

    Args:
        next_due: the kind's oldest mark's due time (UTC).
        refused_at: when the destroy was refused (UTC, the controller's clock).
        stall_after: ``REAPER_STALL_AFTER``, seconds.
    """
    return max(next_due, refused_at + timedelta(seconds=stall_after))


def is_due(next_due: datetime | None, taken_at: datetime) -> bool:
    """Whether a report taken at ``taken_at`` may destroy: the kind's oldest mark is due.

    The destroy then runs on that report's evidence (a recheck after the TTL, rule 4).
    """
    return next_due is not None and taken_at >= next_due


def next_due(kind: str, oldest_mark: datetime | None, missing_ttl: float) -> datetime | None:
    """When the oldest marked row of ``kind`` falls due (UTC), ``None`` if none is marked."""
    if oldest_mark is None:
        return None
    return oldest_mark + timedelta(seconds=destroy_after(kind, missing_ttl))


def orphan_cutoff(taken_at: datetime, missing_ttl: float) -> datetime:
    """Handles first reported at or before this time (UTC) are orphans on the evidence of a
    report ``taken_at`` that still lists them unknown."""
    return taken_at - timedelta(seconds=missing_ttl)


def orphan_due(first_seen: datetime | None, missing_ttl: float) -> datetime | None:
    """When a reported handle the database does not hold becomes an orphan (UTC): unknown
    for ``MISSING_TTL`` since it was first reported (CONTRACT.md §2 ``orphans``)."""
    if first_seen is None:
        return None
    return first_seen + timedelta(seconds=missing_ttl)


def recheck_at(next_due: datetime | None, recheck_due: datetime | None) -> datetime | None:
    """When the collector next needs a fresh report of a kind without being sent one (UTC):
    its oldest mark falls due (``next_due``), or another of its time rules does
    (``recheck_due``: an unknown handle becomes an orphan, a row being created times out),
    whichever is first; ``None`` if neither. Until then an unchanged report of unchanged
    rows needs no diff: whatever else could change the diff, a changed report or changed
    rows, asks for one itself (the change feed), so the time is the last input left."""
    times = [t for t in (next_due, recheck_due) if t is not None]
    return min(times) if times else None


def creating_due(oldest_creating: datetime | None, creating_timeout: float) -> datetime | None:
    """When the oldest row of a kind still being created times out (UTC): its creator
    crashed, and the next reconcile fails and collects it (``CREATING_TIMEOUT``)."""
    if oldest_creating is None:
        return None
    return oldest_creating + timedelta(seconds=creating_timeout)


@dataclass(frozen=True)
class ForwardDecision:
    """Whether a liveness hands a complete report to its collector, and why."""

    forward: bool
    reason: str


def should_forward(
    digest: str,
    forwarded_digest: str | None,
    taken_at: datetime,
    forwarded_at: datetime | None,
    resync_interval: float,
    wanted: bool,
) -> ForwardDecision:
    """Decide whether a complete report needs reconciling against Postgres.

    A changed report always does; an unchanged one only when the collector asked for a
    fresh report (a TTL fell due: destroy only on a report received after it) or when
    ``resync_interval`` seconds passed since the last one (rows the scheduler added since
    must be diffed too, CONTRACT.md §5.3). Otherwise an unchanged report costs no database
    round trip.
    """
    if forwarded_digest is None or digest != forwarded_digest:
        return ForwardDecision(True, "changed")
    if wanted:
        return ForwardDecision(True, "due")
    if forwarded_at is None or (taken_at - forwarded_at).total_seconds() >= resync_interval:
        return ForwardDecision(True, "resync")
    return ForwardDecision(False, "unchanged")


def coalesce(older_handles: list[str], older_also_seen: list[str], newer: list[str]) -> list[str]:
    """The ``also_seen`` of a report that supersedes an unreconciled older one.

    Reports are complete lists, so only the latest needs diffing, except that a handle the
    older report held and the newer lacks was still seen after its mark: rule 4 wants every
    complete report since ``missing_since`` to lack a handle before it is destroyed, so its
    clock must restart. Returns the handles seen in the older report(s) but not in
    ``newer``, sorted. (Staged reports, whose handles are not at hand, restart every mark
    instead: ``Report.restart_all``.)
    """
    keep = set(newer)
    return sorted({*older_handles, *older_also_seen} - keep)


ALSO_SEEN_MAX_BYTES = 64 * 1024
"""Most JSON bytes of ``also_seen`` a report carries (the size above which a report's own
handles are staged in Postgres, ``workflows.staging.INLINE_KEEP_BYTES``). Beyond it every
mark of the kind restarts instead: a burst of large reports superseding each other would
otherwise pile their handles into one command past Temporal's 2 MB limit and fail the
liveness's workflow task for ever (breaker finding, 2026-12-02)."""


def superseded_chunks(queued: list[tuple[str, str]]) -> list[bool]:
    """Which queued chunks a newer report supersedes before they are staged.

    Reports are complete lists, so of each kind only the newest report needs staging and
    diffing: the report of that kind's last queued chunk (chunks queue in the order their
    beats were taken, which the fence keeps in ``seq`` order). Chunks of older reports of
    the kind, complete or not, are dropped unstaged: a backlog of chunks behind a held
    workflow task would otherwise all be staged, each chunk entering the liveness's history
    a second time, past Temporal's 50 MB history limit (breaker finding, 2026-12-04: ten
    22-chunk reports behind a 20 s first task, 53.6 MB, the run terminated). The newest
    report then restarts every mark of its kind (``Report.restart_all``), and is reconciled
    even if it equals the last report reconciled: a dropped report may have seen a handle
    after its mark, and rule 4 wants every complete report since ``missing_since`` to lack
    a handle before it is destroyed (as :func:`coalesce` for complete reports that
    supersede one another).

    Args:
        queued: ``(kind, report_id)`` of each queued chunk, in queue order.

    Returns:
        For each chunk, in the same order, whether it is superseded (to drop).
    """
    newest = {kind: report_id for kind, report_id in queued}
    return [newest[kind] != report_id for kind, report_id in queued]


def carries_also_seen(also_seen: list[str]) -> bool:
    """Whether ``also_seen`` (from :func:`coalesce`) is small enough to carry; if not, the
    report restarts every mark of its kind (``Report.restart_all``): safe, since restarting
    a mark only delays a destroy (rule 4)."""
    return sum(len(h.encode()) + 3 for h in also_seen) + 2 <= ALSO_SEEN_MAX_BYTES
