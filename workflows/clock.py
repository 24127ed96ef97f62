"""The clock side of a liveness: its deadlines, judged by policy, and its one timer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from reaper.core.contract import ReasonInput, WorkerState
    from reaper.core.models import LivenessState, Timings
    from reaper.core.policy import liveness as policy
    from reaper.core.policy.fleet import retire_due

DEADLINE_SLACK_S = 0.25
"""Timers fire this long after their deadline, never on it: ``workflow.now()`` of one
activation can differ by milliseconds between the first run and a replay (seen when the SDK
regroups back-to-back workflow tasks), and a decision taken on the boundary itself would
then differ too: a non-determinism error."""


class StaleClock(Exception):
    """This activation runs on a clock that did not move (``policy.liveness.clock_is_stale``).

    Deliberately not a Temporal ``FailureError``: the SDK then fails the activation instead of
    the workflow. Seen on a legacy query task (sdk-core history_update.rs, workflow_machines.rs
    ``set_current_time``: the clock moves only on WorkflowTaskStarted), core answers the query
    with this failure and evicts the run, so nothing decided on the stale clock is kept; the
    real workflow task then replays the full history on the recorded clock. Never raised on
    replay of a recorded history.
    """


class DeadlineTimer:
    """At most one running timer for a liveness, re-armed only when a deadline moves earlier.

    A heartbeat moves the deadline later but does not touch the timer: when it fires early,
    the loop finds the worker still running and arms the next one. So steady beats cost no
    timer events beyond one per ``STALL_AFTER`` (docs/platform-notes.md: a timer restarted per beat
    costs about two history events a beat).
    """

    def __init__(self) -> None:
        self._timer: asyncio.Future[None] | None = None
        self._deadline = datetime.min.replace(tzinfo=UTC)

    async def _sleep(self, delay: float, label: str, deadline: datetime) -> None:
        await workflow.sleep(delay, summary=label)
        now = workflow.now()  # as the fire is applied
        if policy.clock_is_stale(now, deadline):
            raise StaleClock(f"timer for {deadline.isoformat()} fired at now={now.isoformat()}")

    def _collect(self) -> None:
        """Re-raise the :class:`StaleClock` of a timer that fired, in the loop (a task's own
        exception would not fail the activation)."""
        timer = self._timer
        if timer is not None and timer.done() and not timer.cancelled():
            timer.result()

    def cancel(self) -> None:
        """Cancel the running timer, if any (the liveness is ending)."""
        if self._timer is not None and not self._timer.done():
            self._timer.cancel()
        self._timer = None

    async def wait(
        self, deadline: datetime | None, has_work: Callable[[], bool], label: str
    ) -> datetime | None:
        """Wait until ``has_work()`` or ``deadline`` (UTC) plus the slack has passed.

        Returns:
            The deadline that passed, or ``None`` if work arrived first.
        """
        self._collect()
        if has_work():
            return None
        if deadline is None:
            await workflow.wait_condition(has_work)
            return None
        delay = (deadline + timedelta(seconds=DEADLINE_SLACK_S) - workflow.now()).total_seconds()
        if delay <= 0:
            return deadline
        timer = self._timer
        if timer is None or timer.done() or self._deadline > deadline:
            if timer is not None and not timer.done():
                timer.cancel()
            self._deadline = deadline
            self._timer = timer = asyncio.ensure_future(self._sleep(delay, label, deadline))
        await workflow.wait_condition(lambda: has_work() or timer.done())
        if not timer.done():
            return None
        self._collect()
        self._timer = None
        return self._deadline


class LivenessClock:
    """Judges a liveness on the controller's clock (``reaper.core.policy.liveness``).

    Args:
        live: the liveness's state (shared, mutated here).
    """

    def __init__(self, live: LivenessState) -> None:
        self.live = live

    @property
    def timings(self) -> Timings:
        assert self.live.timings is not None
        return self.live.timings

    def next_deadline(self) -> datetime | None:
        live, t = self.live, self.timings
        times = []
        if live.last_heartbeat_at is not None:
            due = policy.next_deadline(
                live.last_heartbeat_at, live.state, t.stall_after, t.lost_after, live.grace_until
            )
            if due is not None:
                times.append(due)
        times += [
            t
            for t in (live.reap_retry_at, live.retire_retry_at, self.retire_due())
            if t is not None
        ]
        return min(times) if times else None

    def retire_due(self) -> datetime | None:
        """When a lost worker whose reap is done is retired automatically (§5.1), if so."""
        live = self.live
        if (
            live.state is not WorkerState.lost
            or live.recorded_state is not WorkerState.lost
            or live.reap_request is not None
            or live.retire_request is not None
            or live.state_since is None
        ):
            return None
        return retire_due(live.state_since, self.timings.retire_after)

    def on_deadline(self, deadline: datetime) -> None:
        """A deadline passed: grant the outage grace if it was judged late; retry a reap."""
        live, t = self.live, self.timings
        now = workflow.now()
        grace = policy.outage_grace(deadline, now, t.heartbeat_interval, t.stall_after)
        if grace is not None and live.state is not WorkerState.lost:
            # The controller or Temporal was down: the worker's silence is no evidence.
            live.grace_until = max(grace, live.grace_until or grace)
            workflow.logger.warning(
                "deadline of %s judged %ss late: grace until %s",
                live.worker,
                (now - deadline).total_seconds(),
                live.grace_until,
            )
        if live.reap_retry_at is not None and now >= live.reap_retry_at:
            live.reap_retry_at = None
        if live.retire_retry_at is not None and now >= live.retire_retry_at:
            live.retire_retry_at = None

    def judge(self) -> None:
        """Move ``running`` -> ``stalled`` -> ``lost`` as the clock says; only beats go back."""
        live, t = self.live, self.timings
        if live.last_heartbeat_at is None:
            return
        now = workflow.now()
        deadline = policy.next_deadline(
            live.last_heartbeat_at, live.state, t.stall_after, t.lost_after, live.grace_until
        )
        if deadline is not None and deadline < now:
            # Judged late, however the loop got here (a late timer, a run that starts after
            # the controller was down across a continue-as-new, a signal that woke the loop
            # first): the same outage grace as a late timer.
            self.on_deadline(deadline)
        due = self.retire_due()
        if due is not None and now >= due:
            live.retire_request = ReasonInput(
                reason=f"lost for {t.retire_after:g}s", actor="reaper"
            )
            live.retire_automatic = True
        judged = policy.transition(
            live.state, live.last_heartbeat_at, now, t.stall_after, t.lost_after, live.grace_until
        )
        if judged is None:
            return
        live.state, live.state_since = judged, now
        if judged is WorkerState.lost and live.reap_request is None:
            live.reap_request = ReasonInput(
                reason=f"no heartbeat for {t.lost_after:g}s", actor="reaper"
            )
            live.reap_forced = False
