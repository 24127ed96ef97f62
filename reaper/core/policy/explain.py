"""Why a worker, a handle or a task is where it is, and when it next falls due.

The payoff of one place per rule: each explanation is composed from the very functions the
controller decides with (``liveness.next_deadline``, ``fleet.may_reap``,
``fleet.retire_due``, ``collection.next_due``, ``collection.creating_due``, the state
table of ``reaper.core.states``), so what ``reaper explain`` says is what reaper will do.
Operators of Kubernetes and Nomad get event lists from their controllers; this answers the
question they ask of them.

Pure: facts (rows as Postgres holds them, the liveness's view, the timings) and a clock in,
an :class:`Explanation` out. Times are UTC ``datetime``s, durations seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from reaper.core import kinds, states
from reaper.core.contract import WorkerState
from reaper.core.models import Timings
from reaper.core.policy import collection, liveness
from reaper.core.policy.fleet import FleetState, may_reap, retire_due
from reaper.core.policy.reports import liveness_only


@dataclass(frozen=True)
class WorkerFacts:
    """A worker as Postgres holds it, with its liveness's fresher last beat if known.

    ``complete_at`` (kind -> its last complete report) and ``row_heartbeat_at`` are one
    snapshot of the row (written together): ``last_heartbeat_at`` may be the liveness's
    fresher beat, which the row's report times lag.
    """

    name: str
    state: str
    state_since: datetime | None
    last_heartbeat_at: datetime | None
    draining: bool = False
    reaped_at: datetime | None = None
    boot_id: str | None = None
    complete_at: Mapping[str, datetime | None] = field(default_factory=dict)
    row_heartbeat_at: datetime | None = None
    created_at: datetime | None = None


@dataclass(frozen=True)
class FleetFacts:
    """The fleet's disruption state, its counts and when it last left full disruption."""

    state: str = FleetState.normal.value
    healthy: int = 0
    unhealthy: int = 0
    recovered_at: datetime | None = None


@dataclass(frozen=True)
class RowFacts:
    """A container, volume or task row (``kind``: ``container``, ``volume``, ``task``)."""

    kind: str
    handle: str
    worker: str | None
    state: str
    missing_since: datetime | None
    state_changed_at: datetime | None = None
    stop_reason: str | None = None
    service: str | None = None
    replaced_by: str | None = None


@dataclass
class Explanation:
    """What holds a thing where it is and when it next falls due.

    Attributes:
        subject: ``worker w3``, ``container c7``...
        state: its state now.
        because: the rule that holds it there, in one sentence.
        next: what happens next and when, in one sentence (``None``: nothing is due).
        due_at: when ``next`` falls due (UTC), if it is a time.
        notes: further facts that bear on it (draining, disruption, a hold).
    """

    subject: str
    state: str
    because: str
    next: str | None = None
    due_at: datetime | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: times as ISO-8601 UTC."""
        return {
            "subject": self.subject,
            "state": self.state,
            "because": self.because,
            "next": self.next,
            "due_at": self.due_at.isoformat() if self.due_at else None,
            "notes": list(self.notes),
        }


def clock(at: datetime | None) -> str:
    """``12:04:31`` for a time today-ish, full ISO date otherwise; ``never`` for ``None``."""
    return at.strftime("%Y-%m-%d %H:%M:%S UTC") if at is not None else "never"


def _fleet_note(fleet: FleetFacts, t: Timings) -> str:
    total = fleet.healthy + fleet.unhealthy
    return (
        f"fleet in {fleet.state} disruption, {fleet.unhealthy} of {total} unhealthy"
        f" (threshold {t.disruption_threshold:g})"
    )


def reap_done(w: WorkerFacts) -> bool:
    """Whether the worker's reap for its current ``lost`` spell is done (``reaped_at`` at or
    after ``state_since``, as ``activities.reap`` records it)."""
    return w.reaped_at is not None and (w.state_since is None or w.reaped_at >= w.state_since)


def explain_worker(
    w: WorkerFacts,
    fleet: FleetFacts,
    t: Timings,
    now: datetime,
    grace_until: datetime | None = None,
) -> Explanation:
    """Why worker ``w`` is in its state and what its clock does next (rules 5, 6, §5.1),
    judged as the controller judges it: with the controller's timings ``t`` and its outage
    grace ``grace_until`` (UTC; the liveness's ``deadlines`` query), by the same function
    (``policy.liveness.next_deadline``)."""
    state = WorkerState(w.state)
    e = Explanation(f"worker {w.name}", state.value, "")
    if w.draining:
        e.notes.append("draining: nothing new is placed on it")
    meaning = states.worker(state)
    if state not in (
        WorkerState.running,
        WorkerState.stalled,
        WorkerState.lost,
        WorkerState.retired,
    ):
        e.because = f"in state {state.value}" + ("" if meaning.in_fleet else ", out of the fleet")
        e.notes += [f"the clock does not judge {state.value}"] if meaning.clock is None else []
        e.notes += [] if meaning.placeable else ["nothing is placed on it"]
        return e
    if state is WorkerState.retired:
        e.because = f"retired at {clock(w.state_since)}: out of the fleet (§5.1)"
        e.next = "a heartbeat with a new boot id registers it afresh"
        return e
    beat = w.last_heartbeat_at
    silent = f"{(now - beat).total_seconds():.0f}s ago" if beat else "never"
    if beat is None:
        e.because = "registered, no heartbeat recorded yet"
        return e
    due = liveness.next_deadline(beat, state, t.stall_after, t.lost_after, grace_until)
    if grace_until is not None and grace_until > now and state is not WorkerState.lost:
        e.notes.append(
            f"outage grace until {clock(grace_until)}: the controller or Temporal was down,"
            " so its silence is no evidence until then"
        )
    if state is WorkerState.running:
        e.because = f"its last heartbeat was at {clock(beat)} ({silent})"
        e.next, e.due_at = f"stalled at {clock(due)} unless it beats", due
        e.notes.append(f"STALL_AFTER {t.stall_after:g}s")
        reports = reports_note(w, t)
        if reports is not None:
            e.notes.append(reports)
        return e
    if state is WorkerState.stalled:
        e.because = f"no heartbeat since {clock(beat)} ({silent}; STALL_AFTER {t.stall_after:g}s)"
        e.next, e.due_at = f"lost at {clock(due)} unless it beats", due
        e.notes.append(f"LOST_AFTER {t.lost_after:g}s; then its tasks are reaped")
        if FleetState(fleet.state) is FleetState.full:
            e.notes.append(f"reap held: {_fleet_note(fleet, t)} (rule 6)")
        elif fleet.unhealthy:
            e.notes.append(_fleet_note(fleet, t))
        return e
    # lost
    e.because = f"no heartbeat since {clock(beat)} ({silent}; LOST_AFTER {t.lost_after:g}s)"
    if reap_done(w) and w.state_since is not None:
        at = retire_due(w.state_since, t.retire_after)
        e.notes.append(f"its tasks were reaped at {clock(w.reaped_at)}")
        e.next, e.due_at = f"retired automatically at {clock(at)} unless it beats", at
        if FleetState(fleet.state) is FleetState.full:
            e.notes.append(f"retirement held while the {_fleet_note(fleet, t)} (rule 6)")
        return e
    verdict = may_reap(False, w.state, fleet.state, fleet.recovered_at, beat, now, t.lost_after)
    if verdict.allowed:
        e.next = "its reap is due now (the controller is reaping it)"
    else:
        e.next = f"reap held: {verdict.refused}"
        if FleetState(fleet.state) is FleetState.full:
            e.next = f"reap held: {_fleet_note(fleet, t)} (rule 6)"
        e.due_at = verdict.retry_at
        if verdict.retry_at is not None:
            e.next += f"; reaped at {clock(verdict.retry_at)} unless it beats"
    return e


@dataclass(frozen=True)
class MigrationFacts:
    """One task of a draining worker and its newest replacement (§6.1), as Postgres holds
    them (``reaper.cli.read.MigrationRow``'s fields)."""

    task: str
    state: str
    stop_reason: str | None
    replacement: str | None
    replacement_worker: str | None
    replacement_state: str | None


def explain_drain(
    migrate_until: datetime | None,
    drained_at: datetime | None,
    tasks: list[MigrationFacts],
    now: datetime,
) -> list[str]:
    """Notes on a draining worker (CONTRACT.md §6): drained, or its migration (deadline, and
    where each task it still holds stands: its replacement placed, running, or waiting for
    the service's ``max_surge`` or for capacity); ``now`` UTC."""
    if drained_at is not None:
        return [f"drained since {clock(drained_at)}: it holds no pending or running task"]
    if migrate_until is None or migrate_until <= now:
        return ["its tasks stay until they end (a drain without --migrate)"]
    notes = [f"migrating until {clock(migrate_until)}: what is left then is stopped"]
    for t in tasks:
        if t.state not in ("pending", "running"):
            continue
        if t.replacement is None or t.replacement_state not in ("pending", "running"):
            notes.append(f"{t.task}: waits for a replacement (max_surge, or no capacity)")
        elif t.replacement_state == "running":
            notes.append(f"{t.task}: replacement {t.replacement} runs; it stops next")
        else:
            where = t.replacement_worker or "no worker yet (owed)"
            notes.append(f"{t.task}: replacement {t.replacement} placed on {where}, not running")
    return notes


def reports_note(w: WorkerFacts, t: Timings) -> str | None:
    """``reports liveness only since ...`` when ``policy.reports.liveness_only`` judges the
    worker's row so (its own heartbeat and report times, one snapshot); else ``None``."""
    verdict = liveness_only(w.state, w.row_heartbeat_at, w.complete_at, t.resync_interval)
    if verdict is None:
        return None
    kinds = ", ".join(verdict.kinds)
    if verdict.since is not None:
        head = f"reports liveness only since {clock(verdict.since)} ({kinds})"
    else:
        head = f"reports liveness only: no complete report of {kinds}"
        if w.created_at is not None:
            head += f" since it registered at {clock(w.created_at)}"
    return (
        f"{head}: no complete report for more than RESYNC_INTERVAL ({t.resync_interval:g}s);"
        " nothing on it is marked, destroyed, started or removed until one comes (its agent's"
        " log says why)"
    )


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


Event = tuple[datetime, str, str | None]
"""An ``events`` row of the thing explained: ``(at, action, reason)``."""


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
