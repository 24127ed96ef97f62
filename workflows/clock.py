"""The clock side of a liveness: its one timer (the deadlines are
``reaper.core.policy.liveness_machine``'s), and the guard against a stale clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from reaper.core.policy import liveness as policy
    from reaper.core.policy.liveness_clock import rearm_due
    from reaper.core.policy.liveness_machine import DEADLINE_SLACK_S


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
    costs about two history events a beat). With ``rearm-on-beat`` the beat that would be
    the last before the timer fires re-arms it in its own workflow task instead (two events,
    no task of its own), so the timer fires only when beats stop.
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

    def _rearm(self, deadline: datetime | None, rearm_within: float | None) -> bool:
        """Whether the running timer is re-armed for the later ``deadline`` now
        (``liveness_clock.rearm_due``; never when ``rearm_within`` is ``None``)."""
        if rearm_within is None or deadline is None or self._timer is None:
            return False
        return rearm_due(self._deadline, deadline, workflow.now(), rearm_within)

    async def wait(
        self,
        next_deadline: Callable[[], datetime | None],
        has_work: Callable[[], bool],
        label: str,
        rearm_within: float | None = None,
    ) -> datetime | None:
        """Wait until ``has_work()`` or the next deadline (UTC) plus the slack has passed.

        Args:
            next_deadline: the next deadline as it is now (UTC), or ``None``: wait for work
                alone. A beat moves it later.
            has_work: whether the loop has work (evaluated after each activation).
            label: the timer's summary in the Web UI.
            rearm_within: with ``rearm-on-beat``, the heartbeat interval (seconds): also
                return, in a beat's own activation, once the running timer is to be re-armed
                for the moved deadline (``liveness_clock.rearm_due``), so the loop re-arms it
                there instead of letting it fire in a workflow task of its own. ``None``:
                never (runs without ``rearm-on-beat``, as every release before 1.1).

        Returns:
            The deadline that passed, or ``None`` if work arrived first (or a re-arm is due).
        """
        self._collect()
        if has_work():
            return None
        deadline = next_deadline()
        if deadline is None:
            await workflow.wait_condition(has_work)
            return None
        delay = (deadline + timedelta(seconds=DEADLINE_SLACK_S) - workflow.now()).total_seconds()
        if delay <= 0:
            return deadline
        timer = self._timer
        if (
            timer is None
            or timer.done()
            or self._deadline > deadline
            or self._rearm(deadline, rearm_within)
        ):
            if timer is not None and not timer.done():
                timer.cancel()
            self._deadline = deadline
            self._timer = timer = asyncio.ensure_future(self._sleep(delay, label, deadline))
        await workflow.wait_condition(
            lambda: (
                has_work()
                or timer.done()
                or (rearm_within is not None and self._rearm(next_deadline(), rearm_within))
            )
        )
        if not timer.done():
            return None
        self._collect()
        self._timer = None
        return self._deadline
