"""Table tests of the repair policy: which livenesses are suspect, when one is stuck, and
which reset point is chosen (docs/chaos.md, "What the campaigns found").
Times are seconds after T0; durations seconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reaper.core.policy.repair import (
    STUCK_ATTEMPTS,
    SUSPECT_SLACK_S,
    TIMER_SLACK_S,
    Verdict,
    failures_in_a_row,
    is_stuck,
    latest_replayable,
    rejected_event_id,
    repair_verdict,
    retire_cutoff,
    suspect_after,
)
from tests.support.rule_models import is_suspect

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
HB, STALL, LOST = 10.0, 30.0, 300.0
BOUND = LOST + TIMER_SLACK_S + STALL + 2 * HB + SUSPECT_SLACK_S  # 360.25 s


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_the_bound_is_the_contracts_sum():
    # LOST_AFTER (rule 5) + timer slack + STALL_AFTER (last_heartbeat_at lag, §5.3)
    # + 2 x HEARTBEAT_INTERVAL (state shown, §5.3) + slack
    assert suspect_after(HB, STALL, LOST) == BOUND


# workers.state, seconds since workers.last_heartbeat_at -> suspect?
SUSPECTS = [
    ("running", 5, False),  # beating
    ("running", 40, False),  # silent; its liveness will judge it
    ("stalled", 290, False),  # stalled, not lost yet
    ("stalled", 300.5, False),  # lost by now, but the row may lag (§5.3)
    ("stalled", BOUND - 1, False),  # merely slow: within the slack
    ("stalled", BOUND + 1, True),  # should have been written lost long ago
    ("running", BOUND + 1, True),  # never even shown stalled
    ("running", 86_400, True),
    ("lost", 86_400, False),  # judged; lost for less than RETIRE_AFTER (below)
    ("retired", 86_400, False),  # out of the fleet; its liveness completed
    (None, 86_400, False),  # no row
    ("running", None, False),  # never beat (a drain before any beat)
]


@pytest.mark.parametrize("state, silent, expected", SUSPECTS)
def test_which_livenesses_are_suspect(state, silent, expected):
    last = at(-silent) if silent is not None else None
    assert is_suspect(state, last, T0, HB, STALL, LOST) is expected


# run still open?, pending workflow task attempt, failed tasks in a row -> stuck?
STUCK = [
    (True, 0, 0, False),  # no task pending: a liveness waiting on its timer (an outage grace)
    (True, 1, 0, False),  # a task in hand: slow, not failing
    (True, STUCK_ATTEMPTS - 1, 0, False),  # one failure: a crash, a deadlock-detector trip
    (True, STUCK_ATTEMPTS, 0, True),
    (True, 40, 0, True),
    (False, 40, 0, False),  # the run closed meanwhile (retired, reset by an operator)
    (True, 1, 1, False),  # the last task failed once, a beat scheduled the next: not yet
    (True, 1, STUCK_ATTEMPTS - 1, True),  # a beating worker: each failure then attempt 1
    (True, 0, 60, True),
    (False, 1, 60, False),
]


@pytest.mark.parametrize("running, attempt, failed, expected", STUCK)
def test_when_a_suspect_liveness_is_stuck(running, attempt, failed, expected):
    assert is_stuck(running, attempt, failed) is expected


@pytest.mark.parametrize(
    "outcomes, expected",
    [
        ([], 0),
        (["completed", "failed", "failed"], 0),
        (["failed", "completed", "failed"], 1),
        (["failed", "failed", "failed", "completed"], 3),
        (["failed", "timed-out", "failed"], 2),  # a timeout neither counts nor breaks the run
        (["timed-out", "timed-out", "completed"], 0),
    ],
)
def test_failed_workflow_tasks_in_a_row(outcomes, expected):
    assert failures_in_a_row(outcomes) == expected


@pytest.mark.parametrize(
    "message, expected",
    [
        (
            "[TMPRL1100] Nondeterminism error: Activity machine does not handle this event: "
            "HistoryEvent(id: 34, TimerStarted)",
            34,
        ),
        ("Nondeterminism error: No command scheduled for event HistoryEvent(id: 10, X)", 10),
        ("[TMPRL1100] Nondeterminism error: something else entirely", None),
    ],
)
def test_the_event_a_nondeterminism_error_names(message, expected):
    assert rejected_event_id(message) == expected


# The completed workflow tasks of chaos seed 7's stuck liveness (docs/stale-clock.md): 33 is
# the bad task's own completion; its command (event 34) is the one the replay rejects, so
# every prefix through 38 fails.
CHAOS = [4, 12, 18, 23, 27, 33, 38]

# completed tasks, first failing prefix (None: all replay), rejected event -> point, probes
POINTS = [
    (CHAOS, 38, 34, 33, 2),  # the hint: 33 replays, 38 does not
    (CHAOS, 38, None, 33, 3),  # no hint: bisection
    (CHAOS, 4, 5, None, 1),  # nothing replays: no reset point
    (CHAOS, None, None, 38, 3),  # every completed task replays: the last one
    (CHAOS, 27, 34, 23, 4),  # a wrong hint costs probes, not the answer
    (CHAOS, 38, 2, 33, 3),  # a hint before every completed task: bisection
    (list(range(10, 8010, 10)), 5000, None, 4990, 10),  # ~800 tasks: log2 probes
    ([], None, None, None, 0),
]


@pytest.mark.parametrize("completed, failing, rejected, expected, probes", POINTS)
async def test_the_reset_point_is_the_latest_that_replays(
    completed, failing, rejected, expected, probes
):
    asked: list[int] = []

    async def replays(event_id: int) -> bool:
        asked.append(event_id)
        return failing is None or event_id < failing

    assert await latest_replayable(completed, replays, rejected) == expected
    assert len(asked) == probes, asked


@pytest.mark.parametrize(
    "replay_failed, nondeterministic, point, failed, expected",
    [
        (False, False, None, 0, Verdict.not_stuck),  # timeouts (a controller killed twice)
        (False, False, None, 2, Verdict.unrepairable),  # fails, replays: payload limit, say
        (True, True, 33, 0, Verdict.reset),  # the chaos history: reset to event 33
        (True, True, 33, 5, Verdict.reset),
        (True, True, None, 5, Verdict.unrepairable),  # no prefix replays
        (True, False, None, 5, Verdict.unrepairable),  # another replay error
    ],
)
def test_what_the_repair_does_with_a_stuck_liveness(
    replay_failed, nondeterministic, point, failed, expected
):
    assert repair_verdict(replay_failed, nondeterministic, point, failed) is expected


# seconds lost (workers.state_since), with RETIRE_AFTER 3,600 s -> suspect?
RETIRE = 3_600.0
LOST_ROWS = [
    (60, False),  # lost a minute ago
    (RETIRE, False),  # retirement falls due now
    (RETIRE + 2 * HB + 9, False),  # within 2 heartbeat intervals (§5.3) and the slack
    (RETIRE + 2 * HB + 11, True),  # should have been retired by now (§5.1)
    (10 * RETIRE, True),
]


@pytest.mark.parametrize("lost_for, expected", LOST_ROWS)
def test_a_lost_worker_is_suspect_once_its_retirement_is_overdue(lost_for, expected):
    since = at(-lost_for)
    assert is_suspect("lost", at(-lost_for), T0, HB, STALL, LOST, since, RETIRE) is expected
    assert retire_cutoff(T0, HB, RETIRE) == at(-(RETIRE + 2 * HB + 10))
