"""Retirement of a worker (CONTRACT.md §5.1): the step that retires it, a new run's check for
a retired boot, and the end of a retired worker's liveness and collector."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities import ReaperActivities
    from activities.types import RetireRequest, WorkerRecord
    from reaper.core.contract import WorkerState
    from reaper.core.liveness_state import LivenessState
    from reaper.core.models import Timings
    from workflows.common import collector_id, run_activity, signal_quietly, tell_placed


class Retirement:
    """Retires one liveness's worker.

    Args:
        live: the liveness's state (shared, mutated here).
    """

    def __init__(self, live: LivenessState) -> None:
        self.live = live

    @property
    def timings(self) -> Timings:
        assert self.live.timings is not None
        return self.live.timings

    async def retire(self) -> None:
        """Retire the worker (§5.1): tasks reaped and replaced, handle rows destroyed, the
        worker out of the fleet. On success the liveness ends; a refusal is retried later."""
        live, t = self.live, self.timings
        req = live.retire_request
        assert req is not None
        result = await run_activity(
            ReaperActivities.retire_worker,
            RetireRequest(
                worker=live.worker,
                reason=req.reason,
                actor=req.actor,
                automatic=live.retire_automatic,
                at=workflow.now(),
                retire_after=t.retire_after,
                dry_run=t.dry_run,
            ),
            summary=f"retire {live.worker}: {req.reason}",
        )
        await tell_placed(result.replacements)
        done = result.refused in (None, "already retired") and not t.dry_run
        if not done:
            workflow.logger.warning(
                "retirement of %s not done: %s", live.worker, result.refused or "dry run"
            )
            if live.retire_automatic:  # the clock asks again; a dry run only once a period
                later = t.retire_after if t.dry_run else t.stall_after
                live.retire_retry_at = result.retry_at or (
                    workflow.now() + timedelta(seconds=later)
                )
            else:
                live.retire_request = None
            return
        live.retire_request, live.reap_request, live.reap_forced = None, None, False
        live.state, live.state_since = WorkerState.retired, workflow.now()
        live.retired_boot_id = live.boot_id
        live.unforwarded.clear()
        workflow.logger.info("%s retired: %s", live.worker, req.reason)

    async def registers_afresh(self, record: WorkerRecord | None = None) -> bool:
        """A new run: ignore what a retired boot sent (§5.1); False if nothing else came.
        ``record`` is the worker's row if the run has read it already."""
        live = self.live
        if record is None:
            record = await run_activity(
                ReaperActivities.worker_record, live.worker, summary=f"read {live.worker}"
            )
        if record.state is not WorkerState.retired:
            return True
        live.retired_boot_id = record.boot_id
        if live.boot_id != record.boot_id:
            return True  # a new boot: it registers afresh
        workflow.logger.info("beats of %s's retired boot %s ignored", live.worker, record.boot_id)
        live.unforwarded.clear()  # nothing of the retired boot is reconciled
        live.chunks.clear()
        live.ignored += 1
        live.state, live.state_since = WorkerState.retired, workflow.now()  # what agents see
        return False

    async def end(self) -> None:
        """The worker is retired: its collector and this liveness end (§5.1)."""
        # A signal, not a cancellation: the collector ends between two activities, and says
        # so; this run ends after it (bounded, in case the collector is gone).
        if self.live.collector_started and await signal_quietly(
            collector_id(self.live.worker), "stop", None
        ):
            try:
                await workflow.wait_condition(lambda: self.live.collector_stopped, timeout=30)
            except TimeoutError:
                workflow.logger.warning("collector of %s did not stop", self.live.worker)
        await workflow.wait_condition(workflow.all_handlers_finished)
