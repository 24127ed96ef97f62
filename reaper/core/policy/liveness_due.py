"""What a liveness's loop has to do: the steps, in their fixed order, due for the run's one
value (``reaper.core.liveness_state.LivenessState``). "Is there work?" is ``bool(due_steps(live))``.

Pure: no I/O, no Temporal; table-tested in tests/policy/test_liveness_machine.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from reaper.core.contract import WorkerState
from reaper.core.liveness_state import LivenessState
from reaper.core.models import Timings
from reaper.core.policy import liveness as policy


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


def timings_of(live: LivenessState) -> Timings:
    assert live.timings is not None, "the run's timings are loaded before it decides"
    return live.timings


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
        return bool(live.drains)
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
    """A state change, a return or a new boot to write (a lagging ``last_heartbeat_at`` is a
    refresh's)."""
    if live.last_heartbeat_at is None or live.state is WorkerState.retired:
        return False
    if live.recorded_state is not live.state or live.recorded_boot_id != live.boot_id:
        return True
    if live.recorded_forced != (live.reap_forced and live.state is WorkerState.lost):
        return True
    return live.state is WorkerState.running and live.recorded_return != live.returned_at


def _need_refresh(live: LivenessState) -> bool:
    if live.last_heartbeat_at is None or live.state is WorkerState.retired:
        return False
    t = timings_of(live)
    return policy.row_refresh_due(
        live.last_heartbeat_at,
        live.recorded_heartbeat_at,
        t.stall_after,
        t.heartbeat_interval,
    )


def shown_values(live: LivenessState) -> tuple[str, int]:
    """``(ReaperState, ReaperMissing)`` as the Web UI should show them (CONTRACT.md §2):
    ``draining`` for a running worker that drains, ``drained`` once it holds nothing (§6.2;
    a ``drained_at`` is known only in ``rotating-hosts`` runs)."""
    shown = live.state.value
    if live.draining and live.state is WorkerState.running:
        shown = "drained" if live.drained_at is not None else "draining"
    return shown, sum(status.missing for status in live.collected.values())


@dataclass(frozen=True)
class StateRecord:
    """What the liveness writes of its worker when its state is recorded
    (``record_worker_state``), and what that write's ``events`` row says.

    Attributes:
        state: the state to write.
        at: its ``state_since`` (UTC).
        reason: the ``events`` row's reason after ``from -> to``: the reap's reason when
            the worker is lost (``no heartbeat for 300s``, an operator's ``force_reap``
            reason), else ``None``.
        actor: who did it (``reaper``, an operator), with ``reason``.
        returned_at: the return this record writes (its marks are cleared by this one
            write and its retries, rule 4), ``None`` if none is new.
        forced_reap: the worker is lost by an operator's ``force_reap``.
        change: ``running -> lost``, ``new -> running``, or ``refresh`` (for the log).
    """

    state: WorkerState
    at: datetime
    reason: str | None
    actor: str | None
    returned_at: datetime | None
    forced_reap: bool
    change: str


def state_record(live: LivenessState, now: datetime) -> StateRecord:
    """What :data:`Step.record` writes now (``now``: UTC, used when the state has no
    ``state_since`` yet): the state, the reason and actor of its event, a new return."""
    state = live.state
    reap = live.reap_request if state is WorkerState.lost else None
    new_return = state is WorkerState.running and live.recorded_return != live.returned_at
    before = live.recorded_state.value if live.recorded_state else "new"
    return StateRecord(
        state=state,
        at=live.state_since or now,
        reason=reap.reason if reap else None,
        actor=reap.actor if reap else None,
        returned_at=live.returned_at if new_return else None,
        forced_reap=live.reap_forced and state is WorkerState.lost,
        change=f"{before} -> {state.value}" if live.recorded_state is not state else "refresh",
    )
