"""Table tests of the chaos checker's rules (``chaos.rules``): each rule flags a violation
only when the evidence rules out every legitimate explanation. Times are seconds; the
timings are the campaign's own shape (TTL 5, STALL_AFTER 5, LOST_AFTER 12) and a clock
slack of 0.5 s."""

from __future__ import annotations

import pytest

from chaos.ledger import Beat, Command, Window
from chaos.rules import (
    Gap,
    Seen,
    above_count,
    deadline_came,
    fresh_period_broken,
    grace_covers,
    last_holding,
    lost_gaps,
    repeated,
    reported_by,
    sent_by,
    spans_return,
    too_early,
    unchanged_over,
)

TTL, STALL, LOST, TOL = 5.0, 5.0, 12.0, 0.5


def beat(sent: float, acked: float | None = 0.1, *held: str) -> Beat:
    """A beat sent at ``sent``, acknowledged ``acked`` seconds later (``None``: failed)."""
    return Beat(
        "w1",
        "boot-1",
        int(sent * 10),
        sent,
        None if acked is None else sent + acked,
        {"containers": frozenset(held)},
    )


def every(start: float, stop: float, acked: float | None = 0.1) -> list[Beat]:
    """One beat a second in ``[start, stop)``."""
    return [beat(float(t), acked) for t in range(int(start), int(stop))]


S = [Seen(0.0, 0.1, "a"), Seen(5.0, 5.1, "a"), Seen(10.0, 10.1, "a"), Seen(12.0, 12.1, "b")]


@pytest.mark.parametrize(
    "series, t0, t1, expected",
    [
        ([], 1.0, 2.0, None),
        (S, 1.0, 9.0, "a"),  # seen before t0 and after t1, equal throughout
        (S, 0.05, 9.0, None),  # the first read may have been after t0
        (S, 1.0, 11.0, None),  # changed to b before anything after t1 showed a
        (S[:2], 1.0, 9.0, None),  # nothing seen after t1
        (S, 10.5, 11.5, None),  # a before t0, b after t1: it changed in between
    ],
)
def test_unchanged_over(series, t0, t1, expected):
    assert unchanged_over(series, t0, t1) == expected


@pytest.mark.parametrize(
    "at, bounds, flagged",
    [
        (10.0, [("report", 4.0)], 0),  # 6 s after the last report holding it
        (10.0, [("report", 5.2)], 0),  # 4.8 s: within the clock slack
        (10.0, [("report", 6.0)], 1),  # 4 s < TTL
        (10.0, [("report", None), ("created", 9.0)], 1),
        (10.0, [("report", 1.0), ("created", 2.0), ("mark", 3.0)], 0),
        (10.0, [("report", 9.0), ("created", 9.0)], 2),
    ],
)
def test_too_early(at, bounds, flagged):
    assert len(too_early(at, TTL, TOL, bounds)) == flagged


@pytest.mark.parametrize(
    "at, returns, bounds, flagged",
    [
        (32.0, [30.0], [("report", 19.0)], 0),  # absence began TTL before the silence
        (32.0, [30.0], [("report", 21.0)], 1),  # its TTL would span the silence
        (36.0, [30.0], [("report", 29.0)], 0),  # TTL after the return: fine anyway
        (32.0, [40.0], [("report", 31.0)], 0),  # the return came after the destroy
        (32.0, [30.0], [("report", None)], 0),
    ],
)
def test_spans_return(at, returns, bounds, flagged):
    assert len(spans_return(at, returns, TTL, STALL, TOL, bounds)) == flagged


def test_last_holding_takes_the_last_acknowledged_report_that_held_it():
    beats = [beat(1.0, 0.1, "c"), beat(2.0, None, "c"), beat(3.0, 0.1), beat(4.0, 0.1, "c")]
    assert last_holding(beats, "containers", "c", 3.5) == 1.0  # the failed one is no proof
    assert last_holding(beats, "containers", "c", 10.0) == 4.0
    assert last_holding(beats, "containers", "x", 10.0) is None


@pytest.mark.parametrize(
    "beats, judged_by, gaps",
    [
        (every(0, 30), 25.0, 0),  # beat every second: never lost
        (every(0, 4), 16.0, 1),  # silent from 3 s: lost by 16 s is legitimate
        (every(0, 4), 14.0, 0),  # only 11 s after the last beat
        (every(0, 4) + every(16, 30), 15.5, 1),  # a 13 s gap before the verdict
        # Beats failed 4-9 s (an outage) and got through again at 10 s: no 12 s gap.
        (every(0, 4) + every(4, 10, None) + every(10, 30), 20.0, 0),
        # A failed beat may have been delivered, and be the last the controller had.
        ([*every(0, 4), beat(4.0, None), *every(17, 30)], 16.4, 2),
    ],
)
def test_lost_gaps(beats, judged_by, gaps):
    assert len(lost_gaps(beats, judged_by, LOST, TOL)) == gaps


DOWN = [Window("temporal-down", 4.0, 18.0)]


@pytest.mark.parametrize(
    "gap, silent, covered",
    [
        (Gap(beat(3.5), beat(18.5)), False, True),  # beat again 0.6 s after the restart
        (Gap(beat(3.5), beat(30.0)), False, False),  # 12 s after it: no grace left
        (Gap(beat(3.5), beat(18.5)), True, False),  # the agent itself went quiet
        (Gap(beat(3.5), None), False, False),  # never beat again
        (Gap(beat(20.0), beat(40.0)), False, False),  # no outage in the gap
    ],
)
def test_grace_covers(gap, silent, covered):
    assert (grace_covers(gap, DOWN, silent, STALL, TOL) is not None) == covered


def test_one_grace_covers_only_the_first_outage_of_a_gap():
    """Two outages before any beat got through: with ``one-grace`` the second gets no grace
    of its own, so a beat within STALL_AFTER of its end covers nothing."""
    downs = [*DOWN, Window("temporal-down", 19.0, 30.0)]
    gap = Gap(beat(3.5), beat(30.5))
    assert grace_covers(gap, downs, False, STALL, TOL) is None
    first = Gap(beat(3.5), beat(18.5))  # through after the first: covered
    assert grace_covers(first, downs, False, STALL, TOL) == DOWN[0]


@pytest.mark.parametrize(
    "at, recoveries, broken",
    [
        (105.0, [100.0], 100.0),
        (112.0, [100.0], None),
        (105.0, [], None),
        (105.0, [90.0, 101.0], 101.0),
        (95.0, [100.0], None),  # before the recovery: the full-disruption rule applies
    ],
)
def test_fresh_period_broken(at, recoveries, broken):
    assert fresh_period_broken(at, recoveries, LOST, TOL) == broken


def test_repeated():
    assert repeated(["a", "b", "a", "c", "a"]) == {"a": 3}
    assert repeated([]) == {}


# ---- host rotations (CONTRACT.md §6.1) ----------------------------------------------------


@pytest.mark.parametrize(
    "desired, surge, active, migrating, broken",
    [
        (3, 1, 3, 0, None),  # at its count
        (3, 1, 2, 0, None),  # short: the owed-work check's business, not this one's
        (3, 1, 4, 0, "§5.1: service above desired_count"),  # a surplus no drain explains
        (3, 1, 4, 1, None),  # one original on a migrating worker: its replacement
        (3, 1, 4, 3, None),  # three there, one migrating at a time
        (3, 1, 5, 3, "§6.1: service above desired_count + max_surge"),
        (3, 2, 5, 3, None),  # max_surge 2: two at once
        (3, 2, 5, 1, "§5.1: service above desired_count"),  # one original, two surplus
        (3, 2, 6, 3, "§6.1: service above desired_count + max_surge"),
        (1, 3, 4, 1, "§5.1: service above desired_count"),  # max_surge above what migrates
    ],
)
def test_above_count(desired, surge, active, migrating, broken):
    found = above_count(desired, surge, active, migrating)
    assert (found[0] if found else None) == broken


def holding(sent: float, acked: float | None, *tasks: str) -> Beat:
    return Beat("w2", "boot-2", int(sent * 10), sent, acked, {"tasks": frozenset(tasks)})


R = [holding(1.0, 1.1), holding(2.0, None, "r"), holding(3.0, 3.1, "r")]


@pytest.mark.parametrize(
    "beats, at, first",
    [
        (R, 5.0, 2.0),  # reported at 2 s (a beat that failed may have got through)
        (R, 2.3, 2.0),  # within the clock slack after the beat's send
        (R, 1.4, None),  # stopped before any beat reported the replacement
        (R[:1], 5.0, None),  # never reported
        ([], 5.0, None),
    ],
)
def test_reported_by(beats, at, first):
    assert reported_by(beats, "r", at, TOL) == first


ROT = [Command("rotate", 10.0, 4.0), Command("rotate", 11.0, 4.0)]  # a retried attempt


@pytest.mark.parametrize(
    "at, rotations, came",
    [
        (14.0, ROT, True),  # the first attempt's deadline
        (13.6, ROT, True),  # within the clock slack
        (13.0, ROT, False),  # before any attempt's deadline
        (50.0, [], False),  # no rotation at all
        (50.0, [Command("rotate", 10.0, None)], False),  # no deadline recorded
    ],
)
def test_deadline_came(at, rotations, came):
    assert deadline_came(at, rotations, TOL) == came


@pytest.mark.parametrize(
    "at, commands, sent",
    [
        (10.0, [Command("undrain", 9.0)], True),
        (10.0, [Command("undrain", 10.4)], True),  # within the clock slack
        (10.0, [Command("undrain", 11.0)], False),  # sent after the stop
        (10.0, [], False),
    ],
)
def test_sent_by(at, commands, sent):
    assert sent_by(at, commands, TOL) == sent
