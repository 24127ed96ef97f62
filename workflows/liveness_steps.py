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

with workflow.unsafe.imports_passed_through():
    from activities import ReaperActivities
    from activities.types import DrainChange, PinRequest, WorkerStateChange
    from reaper.core.contract import WorkerState
    from reaper.core.models import LivenessState, ReapInput, ReapResult, Timings
    from reaper.core.policy.fleet import FleetState
    from workflows.common import (
        MISSING_ATTR,
        STATE_ATTR,
        WORKER_ATTR,
        collector_id,
        reap_id,
        run_activity,
    )
    from workflows.intake import ReportIntake
    from workflows.reap import WorkerReap
    from workflows.retirement import Retirement
    from workflows.view import CurrentDetails, liveness_details, liveness_facts


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
        self.shown: tuple[str, int] | None = None
        """Search attribute values last upserted."""
        self.details = CurrentDetails()
        self.fleet_seen: str | None = None
        """The fleet state returned by this turn's record, if any (read by the reap)."""

    @property
    def timings(self) -> Timings:
        assert self.live.timings is not None
        return self.live.timings

    # ---- what needs doing --------------------------------------------------------------

    def need_record(self) -> bool:
        """A state change, a return, a new boot or a lagging ``last_heartbeat_at`` to write."""
        live = self.live
        if live.last_heartbeat_at is None or live.state is WorkerState.retired:
            return False
        if live.recorded_state is not live.state or live.recorded_boot_id != live.boot_id:
            return True
        if live.recorded_forced != (live.reap_forced and live.state is WorkerState.lost):
            return True
        if live.state is WorkerState.running and live.recorded_return != live.returned_at:
            return True
        lag = live.last_heartbeat_at - (live.recorded_heartbeat_at or live.last_heartbeat_at)
        return lag.total_seconds() >= self.timings.stall_after / 2

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
            or self.need_reap()
            or self.need_retire()
            or self.drain_change is not None
            or self.need_pin()
            or self.need_forward()
            or bool(self.intake.chunks)
            or self.shown != self.attribute_values()
        )

    async def step(self, judge: Callable[[], None]) -> None:
        """One turn: judge the clock, then record, drain, reap, stage, forward, show."""
        self.fleet_seen = None
        judge()
        if self.need_record():
            await self.record_state()
        if self.need_pin():
            await self.record_pin()
        if self.drain_change is not None:
            await self.apply_drain()
        if self.need_reap():
            await self.reap()
        if self.need_retire():
            await self.retirement.retire()
            if self.live.state is WorkerState.retired:
                self.show()
                return
        if self.intake.chunks:
            await self.intake.stage_chunks()
        if self.need_forward():
            await self.intake.forward()
        self.show()

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
        done = await run_activity(
            ReaperActivities.record_worker_state,
            WorkerStateChange(
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
            ),
            summary=f"{live.worker}: {what}",
        )
        live.recorded_state = state
        live.recorded_forced = live.reap_forced and state is WorkerState.lost
        live.recorded_boot_id, live.recorded_heartbeat_at = live.boot_id, live.last_heartbeat_at
        if new_return:
            live.recorded_return = back
        self.fleet_seen = done.fleet.state if done.fleet else None
        if done.marks_cleared:
            # The return cleared every mark in Postgres: the missing counts shown (query
            # `state`, ReaperMissing) are 0 until the next report says otherwise.
            for status in live.collected.values():
                status.missing, status.next_due = 0, None

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

    async def reap(self) -> None:
        """Run a ``WorkerReap`` child; a refused reap is retried later (rules 5 and 6)."""
        live, t = self.live, self.timings
        req = live.reap_request
        assert req is not None
        seen, self.fleet_seen = self.fleet_seen, None
        if not live.reap_forced:
            # While the fleet is in full disruption, wait without starting a reap child per
            # attempt (the reap activity decides again, in its transaction, anyway).
            if seen is None:
                seen = (
                    await run_activity(
                        ReaperActivities.fleet_status,
                        workflow.now(),
                        summary="fleet disruption check before reaping",
                    )
                ).state
            if FleetState(seen) is FleetState.full:
                live.reap_retry_at = workflow.now() + timedelta(seconds=t.stall_after)
                workflow.logger.warning(
                    "reap of %s deferred: fleet in full disruption", live.worker
                )
                return
        live.reaps += 1
        result: ReapResult = await workflow.execute_child_workflow(
            WorkerReap.run,
            ReapInput(
                worker=live.worker,
                reason=req.reason,
                actor=req.actor,
                forced=live.reap_forced,
                lost_after=t.lost_after,
                last_heartbeat_at=live.last_heartbeat_at,
                dry_run=t.dry_run,
            ),
            id=reap_id(live.worker, live.reaps),
            static_summary=f"reap {live.worker}: {req.reason}",
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
        )
        if result.refused is None:
            live.reap_request, live.reap_forced = None, False
            return
        retry = result.retry_at or workflow.now() + timedelta(seconds=t.stall_after)
        live.reap_retry_at = max(retry, workflow.now() + timedelta(seconds=1))
        workflow.logger.warning(
            "reap of %s refused: %s; retry at %s", live.worker, result.refused, live.reap_retry_at
        )
        if live.reap_forced:  # forced reaps are refused only for unknown workers: give up
            live.reap_request, live.reap_forced, live.reap_retry_at = None, False, None

    def attribute_values(self) -> tuple[str, int]:
        """``(ReaperState, ReaperMissing)`` as the Web UI should show them."""
        live = self.live
        shown = live.state.value
        if live.draining and live.state is WorkerState.running:
            shown = "draining"
        return shown, sum(status.missing for status in live.collected.values())

    def show_details(self) -> None:
        """Keep the Web UI's current details live (no history event; rebuilt on a change)."""
        live = self.live
        self.details.show(
            liveness_facts(live), lambda: liveness_details(live, collector_id(live.worker))
        )

    def show(self) -> None:
        """Show the state: current details, and the search attributes when they changed
        (CONTRACT.md §2)."""
        self.show_details()
        values = self.attribute_values()
        if values == self.shown:
            return
        self.shown = values
        workflow.upsert_search_attributes(
            [
                WORKER_ATTR.value_set(self.live.worker),
                STATE_ATTR.value_set(values[0]),
                MISSING_ATTR.value_set(values[1]),
            ]
        )
