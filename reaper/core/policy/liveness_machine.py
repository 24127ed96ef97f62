"""The liveness as one value and one decision.

A ``WorkerLiveness`` run holds all its state in one value, :class:`~reaper.core.models.
LivenessState` (handed over whole at continue-as-new). Everything that happens to it is an
event (a beat, an operator's signal, the clock, what the collector or an activity found),
and :func:`decide` takes the value, the time and the event, applies the event to the value
and returns what is due: the :class:`Step` s to run, in their fixed order, and an
:class:`Outcome` for the log. "Is there work?" is ``bool(due_steps(live))``: the same
function. The workflow's handlers only parse and hand over; its loop runs the steps, each
an activity or a child, and reports their results back as events.

No I/O and no Temporal here: the rules are ``policy.liveness``'s (fence, transitions,
deadlines, returns), ``policy.fleet``'s (retirement) and the state table's. Table-tested in
tests/policy/test_liveness_machine.py. ``decide`` updates the value in place (it is the one
value a run carries; copying its reports on every beat would cost the hot path) and is
otherwise a function of its arguments: the same value, time and event give the same result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum

from reaper.core.contract import Heartbeat, ReasonInput, WorkerState
from reaper.core.models import LivenessState, Timings
from reaper.core.policy import liveness as policy
from reaper.core.policy.fleet import retire_due, retire_is_stale

DEADLINE_SLACK_S = 0.25
"""Timers fire this long after their deadline, never on it: ``workflow.now()`` of one
activation can differ by milliseconds between the first run and a replay (seen when the SDK
regroups back-to-back workflow tasks), and a decision taken on the boundary itself would
then differ too: a non-determinism error."""


class Step(str, Enum):
    """What the liveness's loop runs, in this order in each turn (:data:`ORDER`): the state
    is recorded before anything acts on it (the reap and the collector read it from
    Postgres), a reap runs only once ``lost`` is recorded, and reports are forwarded only
    once the worker's latest return is recorded."""

    record = "record"
    """Write the worker's state (a change, a return, a new boot) to ``reaper.workers``."""
    refresh = "refresh"
    """Only ``last_heartbeat_at`` lags: refresh the row (§5.3)."""
    pin = "pin"
    """Write a key pinned by a beat to ``reaper.agent_keys`` (§5.2)."""
    drain = "drain"
    """Set or clear ``workers.draining``."""
    reap = "reap"
    """Run a ``WorkerReap`` child."""
    retire = "retire"
    """Retire the worker (§5.1)."""
    stage = "stage"
    """Stage queued chunks of large reports in Postgres."""
    forward = "forward"
    """Hand queued complete reports to the collector."""
    show = "show"
    """Upsert the search attributes shown in the Web UI (CONTRACT.md §2)."""


ORDER = tuple(Step)


@dataclass
class Outcome:
    """What an event did, for the log and the counters.

    Attributes:
        verdict: ``accepted``, ``returned`` (an accepted beat that is the worker's return),
            ``rejected`` (malformed or not allowed: logged and counted, §5.4), ``ignored``
            (well formed and fenced out, or of a retired boot), ``noted`` (no decision).
        reason: why, for a rejection or an ignored event.
        notes: further lines for the log (a grace granted, a retirement requested).
    """

    verdict: str = "noted"
    reason: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Beat:
    """A parsed heartbeat for this worker, before authentication (§5.2)."""

    beat: Heartbeat


@dataclass(frozen=True)
class Authenticated:
    """A heartbeat that passed :func:`admit_beat` and the signature check."""

    beat: Heartbeat


@dataclass(frozen=True)
class ForceReap:
    """An operator's ``force_reap``, authenticated."""

    request: ReasonInput


@dataclass(frozen=True)
class Retire:
    """A ``retire`` from an operator or the agent, authenticated."""

    request: ReasonInput


@dataclass(frozen=True)
class Clock:
    """The loop looks at the clock (a deadline timer fired, or a turn starts)."""


Event = Beat | Authenticated | ForceReap | Retire | Clock


def _timings(live: LivenessState) -> Timings:
    assert live.timings is not None, "the run's timings are loaded before it decides"
    return live.timings


def admit_beat(live: LivenessState, beat: Heartbeat) -> Outcome:
    """Whether a parsed beat goes on to authentication: it must be for this worker, and not
    from a retired worker or its retired boot (§5.1; ignored, logged)."""
    if beat.worker != live.worker:
        return Outcome(
            "rejected", f"worker {beat.worker!r} sent to the liveness of {live.worker!r}"
        )
    if live.state is WorkerState.retired or beat.boot_id == live.retired_boot_id:
        live.ignored += 1
        return Outcome("ignored", "retired boot")
    return Outcome("accepted")


def accept_beat(live: LivenessState, beat: Heartbeat, now: datetime) -> Outcome:
    """Apply an authenticated beat: fence it (CONTRACT.md §2: ``boot_id`` and ``seq``),
    take a new boot, and judge whether it is the worker's return (rule 4); returns
    ``accepted``, ``returned`` or ``ignored``. The reports it carries are the intake's."""
    verdict = policy.fence(
        live.boot_id, live.last_seq, live.previous_boot_ids, beat.boot_id, beat.seq
    )
    if not verdict.accepted:
        live.ignored += 1
        return Outcome("ignored", verdict.value)
    if verdict is policy.Fence.new_boot:
        live.previous_boot_ids = policy.remember_boot(live.previous_boot_ids, live.boot_id)
        live.boot_id = beat.boot_id
    stall_after = live.timings.stall_after + DEADLINE_SLACK_S if live.timings else math.inf
    returned = policy.is_return(
        live.state,
        live.last_heartbeat_at,
        now,
        stall_after,
        forced_reap_pending=live.reap_forced and live.reap_request is not None,
    )
    if live.last_heartbeat_at is None:
        live.state_since = now  # running since its first beat
    live.last_seq, live.last_heartbeat_at = beat.seq, now
    if not returned:
        return Outcome("accepted")
    # Back: running again, and only reports from now on decide (rule 4).
    live.state, live.state_since = WorkerState.running, now
    live.returned_at = now
    live.grace_until = None
    if not live.reap_forced:
        live.reap_request = None
    live.unforwarded.clear()
    return Outcome("returned")


def force_reap(live: LivenessState, req: ReasonInput, now: datetime) -> Outcome:
    """An operator's ``force_reap``: lost at once, reaped past the disruption guard (rule 5)."""
    if live.last_heartbeat_at is None:
        return Outcome("rejected", "force_reap: this worker never sent a valid heartbeat")
    live.reap_request, live.reap_forced, live.reap_retry_at = req, True, None
    if live.state is not WorkerState.lost:
        live.state, live.state_since = WorkerState.lost, now
    return Outcome("accepted")


def retire(live: LivenessState, req: ReasonInput) -> Outcome:
    """A ``retire``: the worker leaves the fleet at once (§5.1); ignored for an unknown or
    retired worker, or when it names a boot that is gone (``policy.fleet.retire_is_stale``)."""
    if live.last_heartbeat_at is None or live.state is WorkerState.retired:
        return Outcome("noted", "retire ignored: unknown or retired already")
    if retire_is_stale(req.boot_id, live.boot_id):
        live.ignored += 1
        return Outcome("ignored", f"retire of boot {req.boot_id} ignored: gone")
    live.retire_request, live.retire_automatic, live.retire_retry_at = req, False, None
    return Outcome("accepted")


# ---- the clock ---------------------------------------------------------------------------


def automatic_retire_due(live: LivenessState) -> datetime | None:
    """When a lost worker whose reap is done is retired automatically (§5.1), if so (UTC)."""
    if (
        live.state is not WorkerState.lost
        or live.recorded_state is not WorkerState.lost
        or live.reap_request is not None
        or live.retire_request is not None
        or live.state_since is None
    ):
        return None
    return retire_due(live.state_since, _timings(live).retire_after)


def next_deadline(live: LivenessState) -> datetime | None:
    """When the liveness must next look at the clock (UTC), or ``None``: the earliest of
    its time rules (``policy.time_rules``: stall, lost, outage grace, reap and retire
    retries, automatic retirement)."""
    t = _timings(live)
    times = []
    if live.last_heartbeat_at is not None:
        due = policy.next_deadline(
            live.last_heartbeat_at, live.state, t.stall_after, t.lost_after, live.grace_until
        )
        if due is not None:
            times.append(due)
    times += [
        at
        for at in (live.reap_retry_at, live.retire_retry_at, automatic_retire_due(live))
        if at is not None
    ]
    return min(times) if times else None


def deadline_passed(live: LivenessState, deadline: datetime, now: datetime) -> Outcome:
    """A deadline passed: grant the outage grace if it was judged late (rule 8); a reap or
    retirement retry whose time came is due again."""
    t = _timings(live)
    out = Outcome()
    grace = policy.outage_grace(deadline, now, t.heartbeat_interval, t.stall_after)
    if grace is not None and live.state is not WorkerState.lost:
        # The controller or Temporal was down: the worker's silence is no evidence.
        live.grace_until = max(grace, live.grace_until or grace)
        late = (now - deadline).total_seconds()
        out.notes.append(f"deadline judged {late}s late: grace until {live.grace_until}")
    if live.reap_retry_at is not None and now >= live.reap_retry_at:
        live.reap_retry_at = None
    if live.retire_retry_at is not None and now >= live.retire_retry_at:
        live.retire_retry_at = None
    return out


def judge(live: LivenessState, now: datetime) -> Outcome:
    """Move ``running`` -> ``stalled`` -> ``lost`` as the clock says (only beats go back);
    request the reap of a worker just lost, and the automatic retirement that fell due."""
    out = Outcome()
    if live.last_heartbeat_at is None:
        return out
    t = _timings(live)
    deadline = policy.next_deadline(
        live.last_heartbeat_at, live.state, t.stall_after, t.lost_after, live.grace_until
    )
    if deadline is not None and deadline < now:
        # Judged late, however the loop got here (a late timer, a run that starts after
        # the controller was down across a continue-as-new, a signal that woke the loop
        # first): the same outage grace as a late timer.
        out.notes += deadline_passed(live, deadline, now).notes
    due = automatic_retire_due(live)
    if due is not None and now >= due:
        live.retire_request = ReasonInput(reason=f"lost for {t.retire_after:g}s", actor="reaper")
        live.retire_automatic = True
    judged = policy.transition(
        live.state, live.last_heartbeat_at, now, t.stall_after, t.lost_after, live.grace_until
    )
    if judged is None:
        return out
    live.state, live.state_since = judged, now
    if judged is WorkerState.lost and live.reap_request is None:
        live.reap_request = ReasonInput(
            reason=f"no heartbeat for {t.lost_after:g}s", actor="reaper"
        )
        live.reap_forced = False
    return out


# ---- what is due ---------------------------------------------------------------------------


def needs(step: Step, live: LivenessState) -> bool:
    """Whether ``step`` is due for ``live`` now (the loop asks again before each step, as
    the steps before it may have changed the value)."""
    if step is Step.record:
        return _need_record(live)
    if step is Step.refresh:
        return _need_refresh(live)
    if step is Step.pin:
        return live.agent_key is not None and not live.agent_key_recorded
    if step is Step.drain:
        return live.drain_request is not None
    if step is Step.reap:
        return (
            live.reap_request is not None
            and live.reap_retry_at is None
            and live.recorded_state is WorkerState.lost
            and live.recorded_forced == live.reap_forced
        )
    if step is Step.retire:
        return (
            live.retire_request is not None
            and live.retire_retry_at is None
            and live.state is not WorkerState.retired
        )
    if step is Step.stage:
        return bool(live.chunks)
    if step is Step.forward:
        return (
            bool(live.unforwarded)
            and live.recorded_state is WorkerState.running
            and live.recorded_return == live.returned_at
        )
    return shown_values(live) != live.shown


def due_steps(live: LivenessState) -> list[Step]:
    """Every step due now, in :data:`ORDER` ("is there work?": ``bool(due_steps(live))``).
    A state record and a refresh exclude each other: a record writes the beat too."""
    steps = [step for step in ORDER if needs(step, live)]
    if Step.record in steps and Step.refresh in steps:
        steps.remove(Step.refresh)
    return steps


def _need_record(live: LivenessState) -> bool:
    """A state change, a return or a new boot to write (and, in runs recorded before the
    ``lean-start`` patch, a lagging ``last_heartbeat_at``)."""
    if live.last_heartbeat_at is None or live.state is WorkerState.retired:
        return False
    if live.recorded_state is not live.state or live.recorded_boot_id != live.boot_id:
        return True
    if live.recorded_forced != (live.reap_forced and live.state is WorkerState.lost):
        return True
    if live.state is WorkerState.running and live.recorded_return != live.returned_at:
        return True
    return not live.features.local_writes and _need_refresh(live)


def _need_refresh(live: LivenessState) -> bool:
    if live.last_heartbeat_at is None or live.state is WorkerState.retired:
        return False
    t = _timings(live)
    return policy.row_refresh_due(
        live.last_heartbeat_at,
        live.recorded_heartbeat_at,
        t.stall_after,
        t.heartbeat_interval if live.features.refresh_at_bound else None,
    )


def shown_values(live: LivenessState) -> tuple[str, int]:
    """``(ReaperState, ReaperMissing)`` as the Web UI should show them (CONTRACT.md §2):
    ``draining`` for a running worker that drains."""
    shown = live.state.value
    if live.draining and live.state is WorkerState.running:
        shown = "draining"
    return shown, sum(status.missing for status in live.collected.values())


# ---- the one entry point -------------------------------------------------------------------


@dataclass
class Decision:
    """What :func:`decide` found: the event's outcome and the steps due after it."""

    outcome: Outcome
    steps: list[Step]


def decide(live: LivenessState, now: datetime, event: Event) -> Decision:
    """Apply ``event`` at ``now`` (UTC, the controller's clock) to ``live``; return its
    outcome and the steps due after it.

    A :class:`Beat` is admitted or not (:func:`admit_beat`); the caller authenticates an
    admitted one (signatures, §5.2) and hands it back as :class:`Authenticated`, which is
    fenced and applied (:func:`accept_beat`). Operator requests apply at once; the
    :class:`Clock` judges the worker (:func:`judge`).
    """
    if isinstance(event, Beat):
        outcome = admit_beat(live, event.beat)
    elif isinstance(event, Authenticated):
        outcome = accept_beat(live, event.beat, now)
    elif isinstance(event, ForceReap):
        outcome = force_reap(live, event.request, now)
    elif isinstance(event, Retire):
        outcome = retire(live, event.request)
    else:
        outcome = judge(live, now)
    return Decision(outcome, due_steps(live))


def retry_later(now: datetime, seconds: float) -> datetime:
    """``now`` plus ``seconds`` (UTC): when a refused step is tried again."""
    return now + timedelta(seconds=seconds)
