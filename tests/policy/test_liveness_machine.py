"""The liveness's one decision, as tables: an event applied to a value at a time gives the
next value, an outcome and the steps due (``reaper.core.policy.liveness_machine``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from reaper.core.contract import Heartbeat, ReasonInput, WorkerState
from reaper.core.liveness_state import DrainRequest, LivenessState
from reaper.core.models import Report, Timings
from reaper.core.policy.liveness_machine import (
    Authenticated,
    Beat,
    Clock,
    Drain,
    ForceReap,
    Retire,
    Step,
    deadline_passed,
    decide,
    due_steps,
    next_deadline,
    state_record,
)
from tests.support.controller import make_settings

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
T = Timings.of(
    make_settings(heartbeat_interval=10, stall_after=30, lost_after=300, retire_after=600)
)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def value(**kw: Any) -> LivenessState:
    """A registered, recorded, running worker beating at T0 (boot b, seq 5), then ``kw``."""
    base: dict[str, Any] = dict(
        worker="w",
        timings=T,
        boot_id="b",
        last_seq=5,
        last_heartbeat_at=T0,
        state_since=T0,
        recorded_state=WorkerState.running,
        recorded_boot_id="b",
        recorded_heartbeat_at=T0,
        shown=("running", 0),
    )
    base.update(kw)
    return LivenessState(**base)


def beat(seq: int, boot: str = "b", worker: str = "w") -> Heartbeat:
    return Heartbeat(worker=worker, boot_id=boot, seq=seq)


REQ = ReasonInput(reason="ops", actor="alice")
QUEUED = Report(kind="volumes", handles=[], taken_at=T0, boot_id="b", digest="d")


@pytest.mark.parametrize(
    ("live", "b", "verdict", "after"),
    [
        (value(), beat(6, worker="x"), "rejected", {}),
        (value(state=WorkerState.retired), beat(6), "ignored", {"ignored": 1}),
        (value(retired_boot_id="old"), beat(1, "old"), "ignored", {"ignored": 1}),
        (value(), beat(6), "accepted", {}),
    ],
)
def test_a_beat_is_admitted_for_its_own_live_worker_only(live, b, verdict, after):
    d = decide(live, at(1), Beat(b))
    assert d.outcome.verdict == verdict
    for field, expected in after.items():
        assert getattr(live, field) == expected
    assert live.last_seq == 5  # admission changes no fence


@pytest.mark.parametrize(
    ("live", "b", "now", "verdict", "expect"),
    [
        (value(), beat(6), 10, "accepted", {"last_seq": 6, "last_heartbeat_at": at(10)}),
        (value(), beat(5), 10, "ignored", {"last_seq": 5, "ignored": 1}),
        (value(), beat(0, "new"), 10, "accepted", {"boot_id": "new", "previous_boot_ids": ["b"]}),
        (
            value(previous_boot_ids=["old"]),
            beat(99, "old"),
            10,
            "ignored",
            {"boot_id": "b"},
        ),
        # A first beat: running since it.
        (
            value(last_heartbeat_at=None, state_since=None, boot_id=None, last_seq=-1),
            beat(0),
            3,
            "accepted",
            {"state_since": at(3), "last_seq": 0},
        ),
        # Silent past STALL_AFTER (judged or not): a return.
        (value(), beat(6), 31, "returned", {"returned_at": at(31), "state_since": at(31)}),
        (
            value(state=WorkerState.stalled, reap_request=REQ, unforwarded={"volumes": QUEUED}),
            beat(6),
            12,
            "returned",
            {"state": WorkerState.running, "reap_request": None, "unforwarded": {}},
        ),
        # A forced reap still pending runs first: no return.
        (
            value(state=WorkerState.lost, reap_request=REQ, reap_forced=True),
            beat(6),
            12,
            "accepted",
            {"state": WorkerState.lost},
        ),
    ],
)
def test_an_authenticated_beat_is_fenced_and_may_be_a_return(live, b, now, verdict, expect):
    d = decide(live, at(now), Authenticated(b))
    assert d.outcome.verdict == verdict
    for field, expected in expect.items():
        assert getattr(live, field) == expected, field


def test_force_reap_makes_a_worker_lost_at_once_and_due_for_a_record_then_a_reap():
    live = value()
    d = decide(live, at(1), ForceReap(REQ))
    assert d.outcome.verdict == "accepted"
    assert (live.state, live.reap_forced, live.state_since) == (WorkerState.lost, True, at(1))
    assert d.steps == [Step.record, Step.show]  # the reap waits for the record
    live.recorded_state, live.recorded_forced = WorkerState.lost, True
    assert due_steps(live) == [Step.reap, Step.show]
    never = value(last_heartbeat_at=None)
    assert decide(never, at(1), ForceReap(REQ)).outcome.verdict == "rejected"


@pytest.mark.parametrize(
    ("live", "req", "verdict"),
    [
        (value(), REQ, "accepted"),
        (value(last_heartbeat_at=None), REQ, "noted"),
        (value(state=WorkerState.retired), REQ, "noted"),
        (value(), ReasonInput(reason="x", boot_id="gone"), "ignored"),
        (value(), ReasonInput(reason="x", boot_id="b"), "accepted"),
    ],
)
def test_retire_acts_for_a_known_live_boot_only(live, req, verdict):
    d = decide(live, at(1), Retire(req))
    assert d.outcome.verdict == verdict
    assert (live.retire_request is not None) == (verdict == "accepted")
    assert (Step.retire in d.steps) == (verdict == "accepted")


@pytest.mark.parametrize(
    ("live", "now", "state", "reap", "retire"),
    [
        (value(), 29, WorkerState.running, False, False),
        (value(), 30, WorkerState.stalled, False, False),
        (value(state=WorkerState.stalled), 300, WorkerState.lost, True, False),
        (
            value(state=WorkerState.stalled, grace_until=at(400)),
            350,
            WorkerState.stalled,
            False,
            False,
        ),
        (
            value(state=WorkerState.lost, recorded_state=WorkerState.lost, state_since=at(300)),
            900,
            WorkerState.lost,
            False,
            True,
        ),
    ],
)
def test_the_clock_moves_a_worker_up_and_asks_for_a_reap_or_retirement(
    live, now, state, reap, retire
):
    decide(live, at(now), Clock())
    assert live.state is state
    assert (live.reap_request is not None) == reap
    assert (live.retire_request is not None) == retire


def test_a_deadline_judged_late_grants_the_outage_grace():
    live = value(state=WorkerState.stalled)
    out = decide(live, at(300 + 60), Clock()).outcome  # 60 s late: the controller was down
    assert live.state is WorkerState.stalled and live.grace_until == at(360 + 30)
    assert out.notes and "grace until" in out.notes[0]
    assert next_deadline(live) == at(390)


def test_consecutive_late_looks_share_one_grace():
    """Queue waits longer than a heartbeat interval made every look late; each granted a new
    grace and a dead worker was never lost (issue 20, bench 7d). One per disruption now."""
    live = value()
    decide(live, at(30 + 60), Clock())  # the stall look, 60 s late: grace until 120
    assert live.state is WorkerState.stalled and live.grace_until == at(120)
    assert next_deadline(live) == at(300)
    out = decide(live, at(300 + 60), Clock()).outcome  # late again, nothing on time between
    assert live.state is WorkerState.lost and live.reap_request is not None
    assert out.notes and "no further grace" in out.notes[0]


def test_a_look_on_time_between_makes_the_next_late_look_a_new_disruption():
    live = value()
    decide(live, at(90), Clock())
    assert live.graced_at == at(90)
    assert deadline_passed(live, at(200), at(200.25)) == []  # a retry timer, on time
    assert live.graced_at is None
    decide(live, at(400), Clock())  # the lost deadline judged 100 s late: a new outage
    assert live.state is WorkerState.stalled and live.grace_until == at(430)


def test_a_timer_a_beat_moved_on_neither_grants_nor_spends_the_grace():
    """A timer armed before a beat fires in the beat's own task, late (the SDK applies the
    beat first): it says nothing about a silence that has not begun. Were it to spend the
    grace, an outage right after would reap a live worker (review of one-grace)."""
    live = value()
    decide(live, at(45), Authenticated(beat(6)))  # beat at 45, in a task 15 s late
    assert deadline_passed(live, at(30), at(45)) == []  # the stall timer armed for 30
    assert live.graced_at is None and live.grace_until is None
    # Temporal down from 46 to 446: the timer for 75 fires late, a first look: its grace.
    assert "grace until" in deadline_passed(live, at(75), at(446))[0]
    decide(live, at(446), Clock())
    assert live.state is WorkerState.stalled and live.grace_until == at(476)


def test_a_late_look_is_judged_once_however_often_its_task_asks():
    live = value()
    decide(live, at(90), Clock())
    assert len(deadline_passed(live, at(300), at(360))) == 1  # the timer: no further grace
    assert deadline_passed(live, at(300), at(360)) == []  # the clock, in the same task


def test_a_beat_ends_the_silence_and_its_grace():
    live = value()
    decide(live, at(90), Clock())
    assert decide(live, at(100), Authenticated(beat(6))).outcome.verdict == "returned"
    assert live.graced_at is None and live.grace_until is None
    decide(live, at(130 + 60), Clock())  # the next silence's stall look, late: its own grace
    assert live.state is WorkerState.stalled and live.grace_until == at(190 + 30)


@pytest.mark.parametrize(
    ("live", "steps"),
    [
        (value(), []),
        (value(recorded_state=None), [Step.record]),
        (value(recorded_boot_id="old"), [Step.record]),
        (value(last_heartbeat_at=at(26)), [Step.refresh]),
        (value(last_heartbeat_at=at(26), recorded_state=None), [Step.record]),
        (value(agent_key="k"), [Step.pin]),
        (value(drains=[{"draining": True}]), [Step.drain]),
        (value(draining=True), [Step.show]),
        (value(retire_request=REQ), [Step.retire]),
        (value(retire_request=REQ, retire_retry_at=at(5)), []),
        (
            value(
                state=WorkerState.lost,
                recorded_state=WorkerState.lost,
                reap_request=REQ,
                shown=("lost", 0),
            ),
            [Step.reap],
        ),
        (
            value(
                unforwarded={
                    "tasks": Report(kind="tasks", handles=[], taken_at=T0, boot_id="b", digest="d")
                }
            ),
            [Step.forward],
        ),
        (
            value(
                unforwarded={
                    "tasks": Report(kind="tasks", handles=[], taken_at=T0, boot_id="b", digest="d")
                },
                returned_at=at(1),
            ),
            [Step.record],
        ),
    ],
)
def test_what_is_due_is_one_function_of_the_value(live, steps):
    assert due_steps(live) == steps


def test_drain_requests_queue_in_order_and_are_due_until_applied():
    live = value()
    first = decide(live, at(1), Drain(DrainRequest(draining=True, reason="upgrade")))
    assert first.outcome.verdict == "accepted" and first.steps == [Step.drain]
    decide(live, at(2), Drain(DrainRequest(draining=False, reason="done")))
    again = decide(live, at(3), Drain(DrainRequest(draining=False, reason="again")))
    assert again.outcome.verdict == "noted" and "sets the same" in (again.outcome.reason or "")
    assert [(r.draining, r.reason) for r in live.drains] == [(True, "upgrade"), (False, "done")]


def test_what_a_state_record_writes_and_says():
    """The reason and actor of a state's events row, and a return written once (rule 4)."""
    live = value()
    decide(live, at(30.3), Clock())  # silent since T0, looked at on time: stalled, then lost
    decide(live, at(300.3), Clock())
    rec = state_record(live, at(301))
    assert (rec.state, rec.change) == (WorkerState.lost, "running -> lost")
    assert (rec.reason, rec.actor) == ("no heartbeat for 300s", "reaper")
    assert rec.returned_at is None and not rec.forced_reap
    live.recorded_state = WorkerState.lost
    assert decide(live, at(310), Authenticated(beat(6))).outcome.verdict == "returned"
    back = state_record(live, at(310))
    assert (back.state, back.reason, back.returned_at) == (WorkerState.running, None, at(310))
    live.recorded_return = at(310)
    assert state_record(live, at(311)).returned_at is None  # written once
    forced = value()
    decide(forced, at(5), ForceReap(REQ))
    rec = state_record(forced, at(5))
    assert rec.forced_reap and (rec.reason, rec.actor) == ("ops", "alice")
