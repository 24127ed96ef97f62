"""The steps of one turn of a liveness loop, each a named effect of what the handlers recorded.

``WorkerLiveness.run`` calls :meth:`LivenessSteps.step` whenever :meth:`LivenessSteps.has_work`
or a deadline passes. The order matters: the state is recorded before anything acts on it
(the reap and the collector read it from Postgres), a reap runs only once ``lost`` is
recorded, and reports are forwarded only once the worker's latest return is recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    from activities import ReaperActivities
    from activities.types import DrainChange, HeartbeatRefresh, PinRequest, WorkerStateChange
    from reaper.core.contract import WorkerState
    from reaper.core.models import LivenessState, Timings
    from reaper.core.policy import liveness as policy
    from workflows.common import ACTIVITY_TIMEOUT, RETRY, run_activity
    from workflows.intake import ReportIntake
    from workflows.reap import reap_step
    from workflows.retirement import Retirement
    from workflows.view import LivenessView

REFRESH_TIMEOUT = timedelta(seconds=5)
REFRESH_RETRY = RetryPolicy(initial_interval=timedelta(seconds=0.5), maximum_attempts=2)
"""A refresh holds its workflow task while it runs: two short attempts, then skipped."""


class LivenessSteps:
    """The effects of a liveness, run in order by :meth:`step`.

    Args:
        live: the liveness's state (shared with the workflow and the intake).
        intake: the liveness's report intake.
    """

    def __init__(self, live: LivenessState, intake: ReportIntake) -> None:
        self.live = live
        self.intake = intake
        self.retirement = Retirement(live, intake)
        self.drain_change: DrainChange | None = None
        """A ``drain`` or ``undrain`` not yet applied (never carried: the loop applies it
        before it continues as new)."""
        self.view = LivenessView(live)
        self.fleet_seen: str | None = None
        """The fleet state returned by this turn's record, if any (read by the reap)."""
        self.local_writes = False
        """Whether this run takes the ``lean-start`` patch (``workflows.run_start``, decided
        once, at the start of the run): the registration and the heartbeat refreshes of the
        worker's row are local activities (no activity task, no workflow task of their
        own), and a record remembers what it wrote, not what arrived while it ran."""
        self.refresh_at_bound = False
        """Whether this run takes ``refresh-at-bound``: refreshes once the row's lag nears
        ``STALL_AFTER``, not at half of it (``policy.liveness.row_refresh_due``)."""

    @property
    def timings(self) -> Timings:
        assert self.live.timings is not None
        return self.live.timings

    # ---- what needs doing --------------------------------------------------------------

    def need_record(self) -> bool:
        """A state change, a return or a new boot to write (and, in runs recorded before the
        ``lean-start`` patch, a lagging ``last_heartbeat_at``)."""
        live = self.live
        if live.last_heartbeat_at is None or live.state is WorkerState.retired:
            return False
        if live.recorded_state is not live.state or live.recorded_boot_id != live.boot_id:
            return True
        if live.recorded_forced != (live.reap_forced and live.state is WorkerState.lost):
            return True
        if live.state is WorkerState.running and live.recorded_return != live.returned_at:
            return True
        return not self.local_writes and self.need_refresh()

    def need_refresh(self) -> bool:
        """Only ``last_heartbeat_at`` lags: a refresh of the row (§5.3), nothing more."""
        live = self.live
        if live.last_heartbeat_at is None or live.state is WorkerState.retired:
            return False
        return policy.row_refresh_due(
            live.last_heartbeat_at,
            live.recorded_heartbeat_at,
            self.timings.stall_after,
            self.timings.heartbeat_interval if self.refresh_at_bound else None,
        )

    def need_pin(self) -> bool:
        """A key pinned by a beat and not yet written to ``reaper.agent_keys`` (§5.2)."""
        live = self.live
        return live.agent_key is not None and not live.agent_key_recorded

    def need_retire(self) -> bool:
        live = self.live
        return (
            live.retire_request is not None
            and live.retire_retry_at is None
            and live.state is not WorkerState.retired
        )

    def need_reap(self) -> bool:
        live = self.live
        return (
            live.reap_request is not None
            and live.reap_retry_at is None
            and live.recorded_state is WorkerState.lost
            and live.recorded_forced == live.reap_forced
        )

    def need_forward(self) -> bool:
        live = self.live
        return (
            bool(live.unforwarded)
            and live.recorded_state is WorkerState.running
            and live.recorded_return == live.returned_at
        )

    def has_work(self) -> bool:
        """Whether :meth:`step` would do anything now."""
        return (
            self.need_record()
            or self.need_refresh()
            or self.need_reap()
            or self.need_retire()
            or self.drain_change is not None
            or self.need_pin()
            or self.need_forward()
            or bool(self.intake.chunks)
            or self.view.changed()
        )

    async def step(self, judge: Callable[[], None]) -> None:
        """One turn: judge the clock, then record, drain, reap, stage, forward, show."""
        self.fleet_seen = None
        judge()
        if self.need_record():
            await self.record_state()
        elif self.need_refresh():
            await self.refresh_row()
        if self.need_pin():
            await self.record_pin()
        if self.drain_change is not None:
            await self.apply_drain()
        if self.need_reap():
            seen, self.fleet_seen = self.fleet_seen, None
            await reap_step(self.live, seen)
        if self.need_retire():
            await self.retirement.retire()
            if self.live.state is WorkerState.retired:
                self.view.show()
                return
        if self.intake.chunks:
            await self.intake.stage_chunks()
        if self.need_forward():
            await self.intake.forward()
        self.view.show()

    # ---- the steps ---------------------------------------------------------------------

    async def record_state(self) -> None:
        """Write the worker's state to ``reaper.workers`` (and the fleet's, rule 6)."""
        live = self.live
        state = live.state
        reason = actor = None
        if state is WorkerState.lost and live.reap_request is not None:
            reason, actor = live.reap_request.reason, live.reap_request.actor
        # A return is recorded once: its marks are cleared by that one write (and its retries).
        new_return = state is WorkerState.running and live.recorded_return != live.returned_at
        back = live.returned_at if new_return else None
        before = live.recorded_state.value if live.recorded_state else "new"
        what = f"{before} -> {state.value}" if live.recorded_state is not state else "refresh"
        change = WorkerStateChange(
            worker=live.worker,
            state=state,
            at=live.state_since or workflow.now(),
            boot_id=live.boot_id,
            last_seq=live.last_seq if live.last_seq >= 0 else None,
            last_heartbeat_at=live.last_heartbeat_at,
            reason=reason,
            actor=actor,
            returned_at=back,
            forced_reap=live.reap_forced and state is WorkerState.lost,
        )
        summary = f"{live.worker}: {what}"
        if self.local_writes and live.recorded_state is None:
            # A registration: a local activity, as cheap as a beat's (issue 11, metric 7a).
            done = await workflow.execute_local_activity_method(
                ReaperActivities.record_worker_state,
                change,
                start_to_close_timeout=ACTIVITY_TIMEOUT,
                retry_policy=RETRY,
                summary=summary,
            )
        else:
            done = await run_activity(ReaperActivities.record_worker_state, change, summary=summary)
        live.recorded_state = state
        if self.local_writes:  # what this record wrote
            live.recorded_forced = change.forced_reap
            live.recorded_boot_id, live.recorded_heartbeat_at = (
                change.boot_id,
                change.last_heartbeat_at,
            )
        else:  # runs recorded before lean-start: what the handlers hold now, as they did
            live.recorded_forced = live.reap_forced and state is WorkerState.lost
            live.recorded_boot_id = live.boot_id
            live.recorded_heartbeat_at = live.last_heartbeat_at
        if new_return:
            live.recorded_return = back
        self.fleet_seen = done.fleet.state if done.fleet else None
        if done.marks_cleared:
            # The return cleared every mark in Postgres: the missing counts shown (query
            # `state`, ReaperMissing) are 0 until the next report says otherwise.
            for status in live.collected.values():
                status.missing, status.next_due = 0, None

    async def refresh_row(self) -> None:
        """Bring the row's ``last_heartbeat_at`` up to date with a local activity: a steady
        beat costs Temporal no activity task and no second workflow task (§5.3, issue 11).

        A failed refresh is skipped, not retried in a loop: the next one falls due after
        another half ``STALL_AFTER``, and a state change writes the row anyway.
        """
        live = self.live
        assert live.last_heartbeat_at is not None and live.boot_id is not None
        beat = HeartbeatRefresh(
            worker=live.worker,
            boot_id=live.boot_id,
            last_seq=live.last_seq,
            last_heartbeat_at=live.last_heartbeat_at,
        )
        try:
            await workflow.execute_local_activity_method(
                ReaperActivities.refresh_heartbeat,
                beat,
                start_to_close_timeout=REFRESH_TIMEOUT,
                retry_policy=REFRESH_RETRY,
                summary=f"{live.worker}: last heartbeat",
            )
        except FailureError as exc:  # a local activity fails with its own error, unwrapped
            workflow.logger.warning("%s: row refresh skipped: %s", live.worker, exc)
        live.recorded_heartbeat_at = beat.last_heartbeat_at

    async def record_pin(self) -> None:
        """Write the pinned key; a key an operator enrolled first wins (§5.2)."""
        live = self.live
        assert live.agent_key is not None
        stored = await run_activity(
            ReaperActivities.pin_agent_key,
            PinRequest(worker=live.worker, public_key=live.agent_key),
            summary=f"pin the key of {live.worker}",
        )
        if stored != live.agent_key:
            workflow.logger.warning(
                "%s: a key enrolled in reaper.agent_keys wins over the one its beat carried",
                live.worker,
            )
        live.agent_key, live.agent_key_recorded = stored, True

    async def apply_drain(self) -> None:
        """Set or clear ``workers.draining``: while set, nothing new is placed on the worker."""
        live = self.live
        change, self.drain_change = self.drain_change, None
        assert change is not None
        verb = "drain" if change.draining else "undrain"
        changed = await run_activity(
            ReaperActivities.set_draining, change, summary=f"{verb} {live.worker}"
        )
        live.draining = change.draining
        live.drain_reason = change.reason if change.draining else None
        workflow.logger.info("%s of %s (changed=%s): %s", verb, live.worker, changed, change.reason)
