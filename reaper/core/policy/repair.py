"""Repair policy: which livenesses are suspect, when one is stuck, where it may be reset.

A safety net for a fault outside reaper: a ``WorkerLiveness`` whose history no replica can
replay (docs/stale-clock.md: a workflow task that ran with a stale
``workflow.now()`` after a Temporal restart). Every later workflow task of that run fails
with a nondeterminism error, the worker is never judged ``lost`` and its tasks never reaped
(CONTRACT.md rules 5 and 8). The remedy is the operator's: reset the run to the last
workflow task the current code can replay; later signals are reapplied.

Pure functions over values; ``activities/repair.py`` applies them. Times are timezone-aware
UTC ``datetime``s, durations seconds.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from enum import Enum

from reaper.core.contract import WorkerState

TIMER_SLACK_S = 0.25
"""A liveness's deadline timer fires this long after the deadline (``workflows.clock``
``DEADLINE_SLACK_S``): part of the time a working liveness takes to judge a silence."""

SUSPECT_SLACK_S = 10.0
"""Beyond the contract's bounds: one workflow task and one ``record_worker_state`` attempt
on a loaded controller (a few seconds on two cores at load 12, docs/chaos.md "A starved
controller"). A liveness older than the bound by less than this may only be slow. The
bound only decides which livenesses are looked at (one ``describe`` each); what decides a
repair is :func:`is_stuck` and a replay that fails, so a low bound costs calls, not safety."""

STUCK_ATTEMPTS = 3
"""The attempt of one pending workflow task from which a suspect liveness is looked at
closely (its history fetched and replayed): two failures in a row. A working liveness fails
a task now and then (a controller killed with the task in hand, whose task times out; the
2 s deadlock detector on a starved controller), so one failure is no reason to replay; two
in a row can still be timeouts, which the replay tells apart (the history replays: not
stuck). The dev server retries a failed workflow task with a backoff (measured: attempt 2
at once, 3 about 20 s later, 4 10 s after that), so a stuck liveness reaches this within
half a minute."""

REPAIRABLE_STATES = frozenset({WorkerState.running.value, WorkerState.stalled.value})
"""A liveness whose worker Postgres shows ``running`` or ``stalled`` can be stuck short of a
verdict (a ``lost`` one short of its retirement, :func:`retire_cutoff`; a ``retired``
worker's liveness has completed)."""

_REJECTED = re.compile(r"HistoryEvent\(id: (\d+)")


def suspect_after(heartbeat_interval: float, stall_after: float, lost_after: float) -> float:
    """Seconds after ``workers.last_heartbeat_at`` by which a working liveness has written
    ``lost`` to Postgres; a ``running`` or ``stalled`` row older than this is suspect.

    The sum of what CONTRACT.md allows: ``LOST_AFTER`` of silence (rule 5) plus the timer's
    slack; ``last_heartbeat_at`` may lag the workflow by ``STALL_AFTER`` (§5.3), so the last
    beat may be that much later than the row says; the state shows within ``2 x
    HEARTBEAT_INTERVAL`` of the change (§5.3); plus :data:`SUSPECT_SLACK_S`. An outage grace
    (the controller or Temporal was down) can hold ``lost`` back longer: then the liveness
    is suspect but not stuck (its tasks do not fail), and nothing is done.

    Args:
        heartbeat_interval, stall_after, lost_after: the controller's settings, seconds.
    """
    return lost_after + TIMER_SLACK_S + stall_after + 2 * heartbeat_interval + SUSPECT_SLACK_S


def suspect_cutoff(
    now: datetime, heartbeat_interval: float, stall_after: float, lost_after: float
) -> datetime:
    """The ``last_heartbeat_at`` (UTC) before which a ``running`` or ``stalled`` worker is
    suspect at ``now`` (UTC): ``now`` minus :func:`suspect_after`."""
    return now - timedelta(seconds=suspect_after(heartbeat_interval, stall_after, lost_after))


def retire_cutoff(now: datetime, heartbeat_interval: float, retire_after: float) -> datetime:
    """The ``state_since`` (UTC) before which a ``lost`` worker is suspect at ``now`` (UTC):
    a working liveness retires a lost worker whose reap is done ``RETIRE_AFTER`` after it was
    lost (§5.1) and shows it within ``2 x HEARTBEAT_INTERVAL`` (§5.3), plus
    :data:`SUSPECT_SLACK_S`. One still ``lost`` later may have a stuck liveness (breaker
    finding, 2026-12-02), or be held by a full disruption (then it is merely looked at)."""
    return now - timedelta(seconds=retire_after + 2 * heartbeat_interval + SUSPECT_SLACK_S)


def is_stuck(running: bool, attempt: int, failures_in_a_row: int = 0) -> bool:
    """Whether a suspect liveness's run may be stuck: still running, and its workflow tasks
    failing: a pending task that has failed at least :data:`STUCK_ATTEMPTS` - 1 times
    (``attempt`` counts from 1, as ``DescribeWorkflowExecution``'s
    ``pending_workflow_task.attempt``; 0: none pending), or the last
    :data:`STUCK_ATTEMPTS` - 1 tasks recorded in its history all failed
    (``failures_in_a_row``). The second covers a worker that keeps beating: each beat that
    arrives after a failure schedules a new task at attempt 1, so the attempt never grows
    (chaos seed 7, 2026-12-02: 60 failed tasks, none past attempt 2). It is stuck, and
    repaired, only if its history also fails to replay with a nondeterminism error on the
    current code (``activities/repair.py``)."""
    return running and max(attempt, failures_in_a_row + 1) >= STUCK_ATTEMPTS


def failures_in_a_row(outcomes_newest_first: Sequence[str]) -> int:
    """How many workflow tasks failed in a row at the end of a history, from its task
    outcomes newest first (``"completed"``, ``"failed"``, ``"timed-out"``): a timed-out task
    (a controller killed with it in hand) neither counts nor breaks the run."""
    n = 0
    for outcome in outcomes_newest_first:
        if outcome == "completed":
            break
        if outcome == "failed":
            n += 1
    return n


class Verdict(str, Enum):
    """What the repair does with a liveness :func:`is_stuck` picked, once its history has
    been replayed on the controller's code."""

    not_stuck = "not-stuck"
    """It replays and none of its recent tasks failed (they timed out): left alone."""
    reset = "reset"
    """A nondeterminism with a replayable point: reset there."""
    unrepairable = "unrepairable"
    """Stuck, and no reset would help: logged, counted, alerted on."""


def repair_verdict(
    replay_failed: bool, nondeterministic: bool, point: int | None, failed_in_a_row: int
) -> Verdict:
    """Whether to reset a liveness that :func:`is_stuck` picked.

    Args:
        replay_failed: its whole history failed to replay on the controller's code.
        nondeterministic: that failure is a nondeterminism error.
        point: :func:`latest_replayable`'s answer (``None``: no prefix replays).
        failed_in_a_row: :func:`failures_in_a_row` of its history.

    A history that replays means the tasks fail for a cause a reset does not remove (a
    command over Temporal's payload limit, say: breaker finding, 2026-12-02) when its last
    tasks failed, and a controller killed with the task in hand (timeouts, which pass) when
    none did. A failure to replay other than a nondeterminism, or with no replayable point,
    has no reset that helps either.
    """
    if not replay_failed:
        return Verdict.unrepairable if failed_in_a_row else Verdict.not_stuck
    if nondeterministic and point is not None:
        return Verdict.reset
    return Verdict.unrepairable


def rejected_event_id(message: str) -> int | None:
    """The event a nondeterminism error names (``... HistoryEvent(id: 34, TimerStarted)``,
    the SDK core's wording), or ``None`` if it names none."""
    found = _REJECTED.search(message)
    return int(found.group(1)) if found else None


async def latest_replayable(
    completed: Sequence[int],
    replays: Callable[[int], Awaitable[bool]],
    rejected: int | None = None,
) -> int | None:
    """The latest reset point the current code can replay, or ``None`` if there is none.

    A reset to the ``WorkflowTaskCompleted`` event ``N`` keeps the events before that
    task's completion and runs the task again, live, on the current code; the replay of
    the events up to ``N`` checks exactly the decisions kept (the commands of every earlier
    task; the task ending at ``N`` is run, not checked). So ``N`` is safe when that prefix
    replays. Prefixes replay monotonically (the replay of a shorter prefix is the start of
    a longer one's, and the code is deterministic), so a bisection finds the latest, with
    the event the replay rejected (:func:`rejected_event_id`) as its first guess: the last
    completed task before it, then the next one. The whole history is known not to replay.

    Args:
        completed: ids of the history's ``WorkflowTaskCompleted`` events, ascending.
        replays: whether the history up to and including an event id replays cleanly.
        rejected: the event id the whole history's replay rejected, if known.

    Returns:
        An element of ``completed``, or ``None`` (no prefix replays: reset to nothing).
    """
    lo, hi = -1, len(completed)  # completed[lo] replays; completed[hi] (or the end) does not
    if rejected is not None:
        guess = bisect_left(completed, rejected) - 1
        for probe in (guess, guess + 1):
            if not lo < probe < hi:
                break
            if await replays(completed[probe]):
                lo = probe
            else:
                hi = probe
                break
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if await replays(completed[mid]):
            lo = mid
        else:
            hi = mid
    return completed[lo] if lo >= 0 else None
