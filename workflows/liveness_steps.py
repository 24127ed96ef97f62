"""The steps of one turn of a liveness loop: the effects (activities, children) of what
``reaper.core.policy.liveness_machine`` finds due, in its fixed order (``Step``).

``WorkerLiveness.run`` calls :meth:`LivenessSteps.step` whenever steps are due or a deadline
passes. The order matters: the state is recorded before anything acts on it (the reap and
the collector read it from Postgres), a reap runs only once ``lost`` is recorded, and
reports are forwarded only once the worker's latest return is recorded.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    from activities import ReaperActivities
    from activities.types import DrainChange, HeartbeatRefresh, PinRequest, WorkerStateChange
    from reaper.core.contract import WorkerState
    from reaper.core.liveness_state import LivenessState
    from reaper.core.models import Timings
    from reaper.core.policy import liveness_machine as machine
    from reaper.core.policy import rollout
    from reaper.core.policy.liveness_machine import Step
    from workflows.common import run_activity, run_local_activity
    from workflows.intake import ReportIntake
    from workflows.reap import loss_in_task, reap_step
    from workflows.retirement import Retirement
    from workflows.view import LivenessView

REFRESH_TIMEOUT = timedelta(seconds=5)
REFRESH_RETRY = RetryPolicy(initial_interval=timedelta(seconds=0.5), maximum_attempts=2)
"""A refresh holds its workflow task while it runs: two short attempts, then skipped."""


class LivenessSteps:
    """The effects of a liveness, run in order by :meth:`step` as
    ``reaper.core.policy.liveness_machine`` finds them due.

    Args:
        live: the liveness's state (shared with the workflow and the intake).
        intake: the liveness's report intake.
    """

    def __init__(self, live: LivenessState, intake: ReportIntake) -> None:
        self.live = live
        self.intake = intake
        self.retirement = Retirement(live)
        self.view = LivenessView(live)
        self.fleet_seen: str | None = None
        """The fleet state returned by this turn's record, if any (read by the reap)."""

    @property
    def timings(self) -> Timings:
        assert self.live.timings is not None
        return self.live.timings

    async def step(self) -> None:
        """One turn: look at the clock, then run each step that is due, in
        ``liveness_machine.ORDER``: record (or else refresh), pin, drain, reap, retire,
        stage, forward, show. Each is asked again just before it runs, as the steps before
        it may have made it due or not."""
        live = self.live
        self.fleet_seen = None
        for note in machine.decide(live, workflow.now(), machine.Clock()).outcome.notes:
            workflow.logger.warning("%s: %s", live.worker, note)
        recorded = False
        for step in machine.ORDER:
            if step is Step.refresh and recorded:
                continue  # the record wrote the beat too
            if step is Step.show:
                self.view.show()
                return
            if not machine.needs(step, live):
                continue
            if step is Step.record:
                await self.record_state()
                recorded = True
            elif step is Step.refresh:
                await self.refresh_row()
            elif step is Step.pin:
                await self.record_pin()
            elif step is Step.drain:
                await self.apply_drain()
            elif step is Step.reap:
                seen, self.fleet_seen = self.fleet_seen, None
                await reap_step(live, seen)
            elif step is Step.retire:
                await self.retirement.retire()
                if live.state is WorkerState.retired:
                    self.view.show()
                    return
            elif step is Step.stage:
                await self.intake.stage_chunks()
            elif step is Step.forward:
                await self.intake.forward()

    # ---- the steps ---------------------------------------------------------------------

    async def record_state(self) -> None:
        """Write the worker's state to ``reaper.workers`` (and the fleet's, rule 6), as
        ``liveness_machine.state_record`` says."""
        live = self.live
        rec = machine.state_record(live, workflow.now())
        state = rec.state
        change = WorkerStateChange(
            worker=live.worker,
            state=state,
            at=rec.at,
            boot_id=live.boot_id,
            last_seq=live.last_seq if live.last_seq >= 0 else None,
            last_heartbeat_at=live.last_heartbeat_at,
            reason=rec.reason,
            actor=rec.actor,
            returned_at=rec.returned_at,
            forced_reap=rec.forced_reap,
            complete_at=dict(live.complete_at),
        )
        summary = f"{live.worker}: {rec.change}"
        if live.recorded_state is None or (state is WorkerState.lost and loss_in_task()):
            # A registration: a local activity, as cheap as a beat's (issue 11, metric 7a). A
            # loss: written in the task that judged it (in-task-loss, issue 20 bench 4d).
            done = await run_local_activity(
                ReaperActivities.record_worker_state, change, summary=summary
            )
        else:
            done = await run_activity(ReaperActivities.record_worker_state, change, summary=summary)
        live.recorded_state = state
        # What this record wrote, not what arrived while it ran.
        live.recorded_forced = change.forced_reap
        live.recorded_boot_id, live.recorded_heartbeat_at = change.boot_id, change.last_heartbeat_at
        if rec.returned_at is not None:
            live.recorded_return = rec.returned_at
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
            complete_at=dict(live.complete_at),
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
        """Apply the queued drain and undrain requests, in order, in one activity
        (``drain-in-order``): while ``workers.draining`` is set, nothing new is placed on
        the worker. A ``rotating-hosts`` run applies them with ``drain_worker`` (migrating
        drains, §6.1; what each request changed is kept for the update that asked,
        ``LivenessState.drain_answers``), an older one with ``set_draining``."""
        live = self.live
        requests, live.drains = live.drains, []
        *earlier, req = requests
        change = DrainChange(
            worker=live.worker,
            draining=req.draining,
            reason=req.reason,
            actor=req.actor,
            key=req.key,
            earlier=earlier,
            migrate=req.migrate,
            deadline=req.deadline,
        )
        verb = "drain" if change.draining else "undrain"
        summary = f"{verb} {live.worker}"
        if live.features.uses(rollout.ROTATING_HOSTS):
            change.at, change.default_deadline = workflow.now(), self.timings.drain_deadline
            done = await run_activity(ReaperActivities.drain_worker, change, summary=summary)
            live.draining, live.migrate_until = done.draining, done.migrate_until
            machine.decide(live, workflow.now(), machine.Drained(done.drained_at is not None))
            for r in requests:
                machine.answer_drain(live, r.key, r.key in done.changed)
            changed = bool(done.changed)
        else:
            changed = await run_activity(ReaperActivities.set_draining, change, summary=summary)
            live.draining = change.draining
        live.drain_reason = change.reason if live.draining else None
        workflow.logger.info(
            "%s of %s (changed=%s, after %d earlier): %s",
            verb,
            live.worker,
            changed,
            len(earlier),
            change.reason,
        )
