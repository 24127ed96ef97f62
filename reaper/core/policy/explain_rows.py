"""Why a container, volume or task row is where it is (or is gone), and when it is next acted
on: ``reaper explain container|volume|task NAME``, from the same functions the controller
decides with (``reaper.core.policy.explain`` for the worker that holds it). Pure: facts and
a clock in, an ``Explanation`` out; UTC times, seconds."""

from __future__ import annotations

from datetime import datetime

from reaper.core import kinds, states
from reaper.core.contract import WorkerState
from reaper.core.models import Timings
from reaper.core.policy import collection
from reaper.core.policy.explain import (
    Event,
    Explanation,
    FleetFacts,
    RowFacts,
    WorkerFacts,
    clock,
    explain_worker,
    reap_done,
)
from reaper.core.policy.fleet import FleetState

ENDED_BECAUSE = {
    "worker-lost": "taken down when its worker was lost or force-reaped",
    "worker-retired": "taken down when its worker retired",
    "missing": "missing from its worker's reports for MISSING_TTL",
}
"""Why a task is over, by its ``stop_reason`` (CONTRACT.md rules 4, 5 and §5.1)."""


def explain_row(
    r: RowFacts,
    worker: WorkerFacts | None,
    fleet: FleetFacts,
    t: Timings,
    now: datetime,
    grace_until: datetime | None = None,
) -> Explanation:
    """Why a container, volume or task row is where it is and when it is next acted on
    (rules 2, 4, 5, 7; ``CREATING_TIMEOUT``); ``grace_until`` is its worker's outage grace
    (:func:`explain_worker`)."""
    e = Explanation(f"{r.kind} {r.handle}", r.state, "")
    on = f" on {r.worker}" if r.worker else ""
    if kinds.kind(r.kind).task:
        task = states.TASKS[states.TaskState(r.state)]
        if task.ended:
            why = ENDED_BECAUSE.get(r.stop_reason or "", f"stop reason {r.stop_reason}")
            e.because = f"{why} ({r.stop_reason}); a worker that reports it lists it in its"
            e.because += " orphans (rule 7)"
            if r.replaced_by:
                e.notes.append(f"replaced by {r.replaced_by}")
            return e
        if task.active and worker is not None and states.worker(worker.state).unhealthy:
            return _held_by_worker(e, r, worker, fleet, t, now, grace_until)
        if task.starts:
            if r.worker is None:
                e.because = "owed: no placeable worker when it was created (§5.1)"
                e.next = (
                    "placed within 2 x HEARTBEAT_INTERVAL"
                    f" ({2 * t.heartbeat_interval:g}s) of a placeable worker appearing"
                )
                return e
            since = r.state_changed_at
            waited = f" ({(now - since).total_seconds():.0f}s ago)" if since else ""
            e.because = f"placed{on} at {clock(since)}{waited}, not reported by its worker yet"
            e.next = "running once its worker reports it (rule 5)"
            e.notes.append(
                "reaper never stops a task its worker has not started (rule 2: only running"
                " tasks are marked missing): if its agent cannot start it (a missing or bad"
                f" template, an image not on the host; the agent logs `task {r.handle} not"
                " started (REASON)` and counts reaper_agent_task_start_failures_total), it"
                " never will, and it stays pending on this worker until the scheduler moves"
                " it or the worker is reaped"
            )
            return e
    else:
        handle = states.HANDLES[states.HandleState(r.state)]
        if handle.being_created:
            due = collection.creating_due(r.state_changed_at, t.creating_timeout)
            e.because = f"being created{on} since {clock(r.state_changed_at)}; never marked"
            e.next, e.due_at = f"failed and collected at {clock(due)} if still {r.state}", due
            return e
    if r.missing_since is None:
        e.because = f"{r.state}{on}, not missing: its worker's latest complete report held it"
        return e
    due = collection.next_due(r.kind, r.missing_since, t.missing_ttl)
    waits = collection.destroy_after(r.kind, t.missing_ttl)
    verb = "stopped (missing)" if kinds.kind(r.kind).task else "destroyed"
    e.because = f"missing since {clock(r.missing_since)}: every complete report since lacked it"
    e.next = (
        f"{verb} at {clock(due)} if still absent from its worker's reports"
        f" ({waits:g}s missing, MISSING_TTL {t.missing_ttl:g}s; a report that holds it"
        " clears the mark)"
    )
    e.due_at = due
    refused = collection.destroy_refused(
        worker.state if worker else None, FleetState(fleet.state) is FleetState.full
    )
    if refused is not None:
        e.notes.append(f"destroy held: {refused} (rules 4 and 6: time away does not count)")
    return e


def _held_by_worker(
    e: Explanation,
    r: RowFacts,
    worker: WorkerFacts,
    fleet: FleetFacts,
    t: Timings,
    now: datetime,
    grace_until: datetime | None = None,
) -> Explanation:
    """A pending or running task of an unhealthy worker (stalled, lost): it goes with its
    worker's reap (rule 5), when :func:`explain_worker` says that comes; after that reap, as
    a stray (``states``: a lost worker holds no tasks)."""
    w = explain_worker(worker, fleet, t, now, grace_until)
    e.because = f"{r.state} on {worker.name}, which is {worker.state}: {w.because}"
    if worker.state == WorkerState.lost.value and reap_done(worker):
        e.next = (
            f"taken down as a stray by the fleet monitor: {worker.name}'s reap is done and a"
            " lost worker holds no tasks"
        )
    elif worker.state == WorkerState.stalled.value:
        e.next = (
            f"reaped (lost) and replaced when {worker.name} is lost, at {clock(w.due_at)},"
            " unless it beats (rule 5)"
        )
        e.due_at = w.due_at
    elif w.next is not None:
        e.next = f"reaped (lost) and replaced with {worker.name}: {w.next}"
        e.due_at = w.due_at
    e.notes += [n for n in w.notes if "held" in n or "unhealthy" in n]
    if r.missing_since is not None:
        e.notes.append(
            f"marked missing since {clock(r.missing_since)}: not destroyed while its worker"
            " is away (rule 4: time away does not count)"
        )
    return e


def history(events: list[Event]) -> list[str]:
    """``events`` (oldest first) as notes: ``2026-12-03 12:01:02 UTC destroyed: missing``."""
    return [f"{clock(at)} {action}" + (f": {why}" if why else "") for at, action, why in events]


def explain_gone(kind: str, handle: str, events: list[Event]) -> Explanation:
    """A row that is not in Postgres (any more): what its newest event says."""
    e = Explanation(f"{kind} {handle}", "absent", "no row in Postgres")
    if events:
        at, action, reason = events[-1]
        e.because = f"{action} at {clock(at)}" + (f": {reason}" if reason else "")
    return e
