"""The clock of a liveness: when it must next look, what a passed deadline grants, and how the
clock moves a worker (``running`` -> ``stalled`` -> ``lost``; only beats go back), with the
reap and the automatic retirement that follow.

Pure: no I/O, no Temporal; each function takes the run's one value and the time, updates
the value and returns lines for the log. Table-tested in tests/policy/test_liveness_machine.py.
"""

from __future__ import annotations

from datetime import datetime

from reaper.core.contract import ReasonInput, WorkerState
from reaper.core.liveness_state import LivenessState
from reaper.core.policy import liveness as policy
from reaper.core.policy.fleet import retire_due
from reaper.core.policy.liveness_due import timings_of

DEADLINE_SLACK_S = 0.25
"""Timers fire this long after their deadline, never on it: ``workflow.now()`` of one
activation can differ by milliseconds between the first run and a replay (seen when the SDK
regroups back-to-back workflow tasks), and a decision taken on the boundary itself would
then differ too: a non-determinism error."""


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
    return retire_due(live.state_since, timings_of(live).retire_after)


def silence_deadline(live: LivenessState) -> datetime | None:
    """The worker's own deadline (UTC): when its silence makes it stalled or lost, never
    before its outage grace ends; ``None`` before its first beat or once lost."""
    if live.last_heartbeat_at is None:
        return None
    t = timings_of(live)
    return policy.next_deadline(
        live.last_heartbeat_at, live.state, t.stall_after, t.lost_after, live.grace_until
    )


def next_deadline(live: LivenessState) -> datetime | None:
    """When the liveness must next look at the clock (UTC), or ``None``: the earliest of
    its time rules (``policy.time_rules``: stall, lost, outage grace, reap and retire
    retries, automatic retirement)."""
    times = [
        at
        for at in (
            silence_deadline(live),
            live.reap_retry_at,
            live.retire_retry_at,
            automatic_retire_due(live),
        )
        if at is not None
    ]
    return min(times) if times else None


def rearm_due(
    armed_for: datetime, deadline: datetime, now: datetime, heartbeat_interval: float
) -> bool:
    """Whether the timer armed for ``armed_for`` is re-armed for ``deadline`` now (UTC; the
    interval in seconds), in the workflow task of the beat that moved the deadline later:
    when it would otherwise fire before the next beat, expected ``heartbeat_interval`` from
    now give or take half an interval. Each re-arm is a ``TimerCanceled`` and a
    ``TimerStarted``; a timer left to fire while the worker is healthy costs a workflow task
    of its own and five events (issue 20, BENCHMARKS.md). At the defaults (STALL_AFTER three
    intervals) every other beat re-arms and the timer never fires while beats come.

    A timer due within a tenth of an interval is left to fire: cancelling it could race its
    firing while the beat's task is with the controller, a cancel the server then has to
    refuse (Temporal's time-skipping test server strands the run, temporalio/sdk-java#3088),
    and a beat that late is rare while beats come on time."""
    left = (armed_for - now).total_seconds()
    return armed_for < deadline and 0.1 * heartbeat_interval < left <= 1.5 * heartbeat_interval


def deadline_passed(live: LivenessState, deadline: datetime, now: datetime) -> list[str]:
    """A deadline passed: grant the outage grace if it was judged late (rule 8), once per
    disruption (``one-grace``, ``policy.liveness.outage_grace``); a reap or retirement retry
    whose time came is due again. Returns lines for the log.

    A late deadline that no longer stands, because a beat in the same
    workflow task moved the worker's deadline later, says nothing about its silence: it
    neither grants nor spends a grace (a timer armed before the beat fires in the same task:
    the SDK applies the beat first). Each look is judged once, however many times the task
    asks (the timer fired, then the clock is judged)."""
    t = timings_of(live)
    notes: list[str] = []
    late = policy.judged_late(deadline, now, t.heartbeat_interval)
    if not late:
        live.graced_at = None  # the controller watched: a later outage is a new one
    elif _moved_on(live, deadline):
        pass
    elif live.looked_late_at != now and live.state is not WorkerState.lost:
        live.looked_late_at = now
        spent = live.graced_at is not None
        grace = policy.outage_grace(deadline, now, t.heartbeat_interval, t.stall_after, spent)
        lateness = (now - deadline).total_seconds()
        if grace is not None:
            # The controller or Temporal was down: the worker's silence is no evidence.
            live.grace_until = max(grace, live.grace_until or grace)
            live.graced_at = now
            notes.append(f"deadline judged {lateness}s late: grace until {live.grace_until}")
        else:
            notes.append(
                f"deadline judged {lateness}s late again: no further grace (one per"
                f" disruption; the last ended {live.grace_until})"
            )
    if live.reap_retry_at is not None and now >= live.reap_retry_at:
        live.reap_retry_at = None
    if live.retire_retry_at is not None and now >= live.retire_retry_at:
        live.retire_retry_at = None
    return notes


def _moved_on(live: LivenessState, deadline: datetime) -> bool:
    """Whether the worker's own deadline (stall, lost, grace end) now lies after
    ``deadline``: a beat moved it since that deadline was armed."""
    standing = silence_deadline(live)
    return standing is not None and standing > deadline


def judge(live: LivenessState, now: datetime) -> list[str]:
    """Move ``running`` -> ``stalled`` -> ``lost`` as the clock says (only beats go back);
    request the reap of a worker just lost, and the automatic retirement that fell due.
    Returns lines for the log."""
    notes: list[str] = []
    if live.last_heartbeat_at is None:
        return notes
    t = timings_of(live)
    deadline = silence_deadline(live)
    if deadline is not None and deadline < now:
        # Judged late, however the loop got here (a late timer, a run that starts after
        # the controller was down across a continue-as-new, a signal that woke the loop
        # first): the same outage grace as a late timer.
        notes += deadline_passed(live, deadline, now)
    due = automatic_retire_due(live)
    if due is not None and now >= due:
        live.retire_request = ReasonInput(reason=f"lost for {t.retire_after:g}s", actor="reaper")
        live.retire_automatic = True
    judged = policy.transition(
        live.state, live.last_heartbeat_at, now, t.stall_after, t.lost_after, live.grace_until
    )
    if judged is None:
        return notes
    live.state, live.state_since = judged, now
    if judged is WorkerState.lost and live.reap_request is None:
        live.reap_request = ReasonInput(
            reason=f"no heartbeat for {t.lost_after:g}s", actor="reaper"
        )
        live.reap_forced = False
    return notes
