"""Table tests of the liveness policy: fencing, and when a worker is stalled, lost or back
(CONTRACT.md §2 and rules 4-6). Times are seconds after T0; durations seconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reaper.core.contract import WorkerState
from reaper.core.policy import liveness as liveness_policy
from reaper.core.policy.liveness import (
    MAX_REMEMBERED_BOOT_IDS,
    Fence,
    clock_is_stale,
    fence,
    is_return,
    judge_liveness,
    next_deadline,
    outage_grace,
    remember_boot,
    row_refresh_due,
    transition,
)
from reaper.core.policy.returns import ReturnMarks, marks_at_record
from reaper.core.states import WorkerMeaning

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
R, S, L = WorkerState.running, WorkerState.stalled, WorkerState.lost


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "current, last_seq, previous, boot, seq, expected",
    [
        (None, -1, [], "b1", 0, Fence.new_boot),  # first beat ever
        ("b1", 5, [], "b1", 6, Fence.accept),  # next seq
        ("b1", 5, [], "b1", 5, Fence.stale_seq),  # duplicate delivery
        ("b1", 5, [], "b1", 3, Fence.stale_seq),  # late, out of order
        ("b2", 0, ["b1"], "b1", 99, Fence.old_boot),  # late beat of an older boot
        ("b1", 5, [], "b2", 0, Fence.new_boot),  # restart with fresh state
        ("b2", 7, ["b1"], "b3", 0, Fence.new_boot),
    ],
)
def test_fence_seq_and_boot_id_decide(current, last_seq, previous, boot, seq, expected):
    assert fence(current, last_seq, previous, boot, seq) is expected


def test_remember_boot_is_bounded():
    previous: list[str] = []
    for i in range(40):
        previous = remember_boot(previous, f"b{i}")
    assert len(previous) == MAX_REMEMBERED_BOOT_IDS
    assert previous[-1] == "b39"


@pytest.mark.parametrize(
    "silent, expected",
    [(0, R), (29.9, R), (30, S), (299, S), (300, L), (10_000, L)],
)
def test_judge_liveness_on_controller_clock(silent, expected):
    assert judge_liveness(T0, at(silent), 30, 300) is expected


# When is a worker lost? current state, seconds of silence, grace until -> transition
WHEN_LOST = [
    (R, 10, None, None),  # beating
    (R, 30, None, S),  # STALL_AFTER of silence
    (R, 300, None, L),  # straight to lost if the loop was away
    (S, 299, None, None),
    (S, 300, None, L),  # LOST_AFTER of silence
    (S, 300, 330, None),  # an outage granted grace: not lost yet
    (S, 331, 330, L),  # grace over
    (R, 400, 500, S),  # grace holds lost back, not stalled
    (L, 10, None, None),  # never backwards: only a beat brings it back
    (S, 10, None, None),
]


@pytest.mark.parametrize("current, silent, grace, expected", WHEN_LOST)
def test_when_a_worker_is_stalled_or_lost(current, silent, grace, expected):
    grace_until = at(grace) if grace is not None else None
    assert transition(current, T0, at(silent), 30, 300, grace_until) is expected


@pytest.mark.parametrize(
    "current, last_beat, now, forced, returned",
    [
        (R, 0, 10, False, False),  # a steady beat
        (R, None, 0, False, False),  # a first beat is not a return
        (R, 0, 30, False, True),  # STALL_AFTER of silence, even unjudged
        (S, 0, 31, False, True),
        (L, 0, 900, False, True),
        (L, 0, 900, True, False),  # a forced reap still pending runs first
    ],
)
def test_when_a_beat_is_a_return(current, last_beat, now, forced, returned):
    last = at(last_beat) if last_beat is not None else None
    assert is_return(current, last, at(now), 30, forced) is returned


def test_a_beat_never_ends_a_held_state(monkeypatch):
    """A state the clock does not judge and a beat does not leave (a row of
    ``reaper.core.states``) is held: no beat is its return, however long the silence; only a
    command ends it. Declared in the states table alone (issue 33)."""
    held = {**liveness_policy.WORKERS, S: WorkerMeaning(clock=None, left_by_a_beat=False)}
    monkeypatch.setattr(liveness_policy, "WORKERS", held)
    assert not is_return(S, at(0), at(900), 30, False)
    assert is_return(L, at(0), at(900), 30, False)


@pytest.mark.parametrize(
    "state, grace, expected",
    [
        (R, None, at(30)),
        (S, None, at(300)),
        (S, at(100), at(300)),  # grace ending before lost changes nothing
        (S, at(400), at(400)),  # grace after an outage postpones lost
        (L, None, None),
    ],
)
def test_next_deadline(state, grace, expected):
    assert next_deadline(T0, state, 30, 300, grace) == expected


@pytest.mark.parametrize(
    "late, expected",
    [(0, None), (10, None), (10.5, at(10.5 + 30)), (600, at(600 + 30))],
)
def test_outage_grace_only_when_judged_late(late, expected):
    assert outage_grace(T0, at(late), 10, 30) == expected


def test_outage_grace_once_per_disruption():
    assert outage_grace(T0, at(600), 10, 30, spent=True) is None


@pytest.mark.parametrize(
    "last_beat, recorded, stall_after, interval, expected",
    [
        (at(10), None, 30, 10, False),  # never written: the state record writes the row
        (at(20), at(0), 30, 10, False),  # the second beat at the defaults: not yet
        (at(24.9), at(0), 30, 10, False),  # a late second beat: still under the bound
        (at(25), at(0), 30, 10, True),  # STALL_AFTER - half an interval
        (at(30), at(0), 30, 10, True),  # the third beat at the defaults
        (at(10), at(0), 20, 10, False),  # STALL_AFTER of two intervals: not on every beat
        (at(15), at(0), 20, 10, True),  # ... but on every other one
        (at(14), at(0), 20, 10, False),
        (at(3), at(0), 6, 12, True),  # an interval longer than STALL_AFTER: half of it
        (at(59.5), at(0), 60, 1, True),  # a short interval: close to the bound
        (at(59.4), at(0), 60, 1, False),
        (at(30), at(0), 60, 1, False),  # the old rule's point: no write yet
    ],
)
def test_when_the_workers_row_heartbeat_is_refreshed(
    last_beat, recorded, stall_after, interval, expected
):
    """The lag a reader can see stays under ``STALL_AFTER`` (CONTRACT.md §5.3) with a write
    every third beat at the defaults (``refresh-at-bound``)."""
    assert row_refresh_due(last_beat, recorded, stall_after, interval) is expected


@pytest.mark.parametrize(
    "now, deadline, stale",
    [
        (at(30.3), at(30), False),  # timer due 0.25 s after its deadline: on time
        (at(30), at(30), False),  # on the deadline (a replay a few ms early)
        (at(29.9), at(30), True),  # fired on a clock before its deadline: stale
        (at(12), at(30), True),  # the previous task's clock (15 s behind, as reproduced)
    ],
)
def test_a_stale_clock_is_told_by_a_timer_that_fired_early(now, deadline, stale):
    """sdk-core applies a legacy query's trailing events on the previous task's clock."""
    assert clock_is_stale(now, deadline) is stale


@pytest.mark.parametrize(
    ("recorded", "since", "new", "returned", "expected"),
    [
        (None, None, R, None, ReturnMarks()),  # a registration
        (S, at(0), R, at(40), ReturnMarks(clear=True, cleared=True)),  # back from stalled
        (L, at(0), R, None, ReturnMarks(clear=True, cleared=True)),  # back from lost
        # A silence the liveness could not judge in time: the row still says running since
        # before the return.
        (R, at(0), R, at(40), ReturnMarks(clear=True, restamp=True, cleared=True)),
        (R, at(40), R, at(40), ReturnMarks(cleared=True)),  # a retry: cleared already
        (R, at(0), R, None, ReturnMarks()),  # a refresh, no return
        (R, at(0), S, None, ReturnMarks()),  # a stall clears nothing
        (S, at(0), L, None, ReturnMarks()),
        (L, at(0), "retired", None, ReturnMarks()),
        # A worker registered again after its retirement: time there did not decide either.
        ("retired", at(0), R, None, ReturnMarks(clear=True, cleared=True)),
    ],
)
def test_what_recording_a_state_does_to_the_marks(recorded, since, new, returned, expected):
    """Rule 4: time stalled or lost does not count; a return clears every mark once."""
    assert marks_at_record(recorded, since, new, returned) == expected
