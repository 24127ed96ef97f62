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

from reaper.core import states
from reaper.core.contract import WorkerState
from reaper.core.models import Timings
from reaper.core.policy import liveness
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


Event = tuple[datetime, str, str | None]
"""An ``events`` row of the thing explained: ``(at, action, reason)``."""


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
