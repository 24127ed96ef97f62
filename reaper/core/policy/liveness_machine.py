"""The liveness as one value and one decision.

A ``WorkerLiveness`` run holds all its state in one value, :class:`~reaper.core.liveness_state.
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
from datetime import datetime

from reaper.core.contract import Heartbeat, ReasonInput, WorkerState
from reaper.core.liveness_state import DrainRequest, LivenessState
from reaper.core.policy import liveness as policy
from reaper.core.policy.drain import queue_drain
from reaper.core.policy.fleet import retire_is_stale
from reaper.core.policy.liveness_clock import (
    DEADLINE_SLACK_S,
    automatic_retire_due,
    deadline_passed,
    judge,
    next_deadline,
)
from reaper.core.policy.liveness_due import (
    ORDER,
    StateRecord,
    Step,
    due_steps,
    needs,
    shown_values,
    state_record,
)
from reaper.core.policy.migration import return_undrains

__all__ = [
    "DEADLINE_SLACK_S",
    "ORDER",
    "Authenticated",
    "Beat",
    "Clock",
    "Decision",
    "Drain",
    "Drained",
    "ForceReap",
    "Outcome",
    "Retire",
    "StateRecord",
    "Step",
    "answer_drain",
    "automatic_retire_due",
    "deadline_passed",
    "decide",
    "due_steps",
    "judge",
    "needs",
    "next_deadline",
    "shown_values",
    "state_record",
]


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
class Drain:
    """An operator's ``drain`` or ``undrain`` (or the agent's ``drain``), authenticated, and
    the run that took it (``workflow id:run id``), which names its ``events.dedupe`` key."""

    request: DrainRequest
    run: str = ""


@dataclass(frozen=True)
class Drained:
    """What the collector read of the worker's row (§6.2): drained or not."""

    drained: bool


@dataclass(frozen=True)
class Retire:
    """A ``retire`` from an operator or the agent, authenticated."""

    request: ReasonInput


@dataclass(frozen=True)
class Clock:
    """The loop looks at the clock (a deadline timer fired, or a turn starts)."""


Event = Beat | Authenticated | ForceReap | Drain | Drained | Retire | Clock

MAX_ANSWERS = 32
"""The drain and undrain answers a liveness keeps (``LivenessState.drain_answers``): an
update waits for its own, which comes within one turn of the loop."""


def answer_drain(live: LivenessState, key: str, changed: bool) -> None:
    """Record what the drain request ``key`` did (an update answers with it), keeping the
    newest :data:`MAX_ANSWERS`."""
    live.drain_answers[key] = changed
    while len(live.drain_answers) > MAX_ANSWERS:
        del live.drain_answers[next(iter(live.drain_answers))]


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
    live.graced_at = None  # the silence ended: a later outage gets a grace of its own
    if not returned:
        return Outcome("accepted")
    # Back: running again, and only reports from now on decide (rule 4); back from lost it
    # is drained no more (§6.2, ``policy.migration.return_undrains``).
    if return_undrains(live.state.value, WorkerState.running.value):
        live.drained_at = None
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


def drain(live: LivenessState, req: DrainRequest, run: str) -> Outcome:
    """A ``drain`` or ``undrain``: keyed ``drain:{run}:{n}`` (the n-th taken), queued, to be
    applied in order of arrival (``policy.drain.queue_drain``); ``noted`` with the reason
    when it drops requests."""
    live.drains_taken += 1
    req = req.model_copy(update={"key": f"drain:{run}:{live.drains_taken}"})
    before = live.drains
    live.drains, dropped = queue_drain(live.drains, req)
    verb = "drain" if req.draining else "undrain"
    if dropped == 1:
        answer_drain(live, req.key, False)
        return Outcome("noted", f"{verb} dropped: the request before it sets the same")
    if dropped == 2:
        answer_drain(live, before[-1].key, False)
        answer_drain(live, req.key, False)
        return Outcome("noted", f"{verb} dropped with the request it undoes: too many queued")
    return Outcome("accepted")


def drained(live: LivenessState, flag: bool, now: datetime) -> Outcome:
    """The collector read the worker drained (§6.2) or not: shown from ``now`` (UTC)."""
    if not flag:
        live.drained_at = None
    elif live.drained_at is None:
        live.drained_at = now
    return Outcome()


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
    elif isinstance(event, Drain):
        outcome = drain(live, event.request, event.run)
    elif isinstance(event, Drained):
        outcome = drained(live, event.drained, now)
    elif isinstance(event, Retire):
        outcome = retire(live, event.request)
    else:
        outcome = Outcome(notes=judge(live, now))
    return Decision(outcome, due_steps(live))
