"""``WorkerReap``: one reap of a lost or force-reaped worker (``reap-{worker}-{n}``), and
:func:`reap_step`, the liveness's step that starts it.

A child of the worker's liveness. The reap itself is one transaction in one activity, so a
heartbeat arriving meanwhile, or a controller crash at any point, leaves no task half-reaped;
the workflow then tells each worker that received a replacement to pick it up.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ChildWorkflowError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from activities import ReaperActivities
    from activities.types import ReapRequest
    from reaper.core.liveness_state import LivenessState
    from reaper.core.models import ReapInput, ReapResult
    from reaper.core.policy.fleet import FleetState
    from workflows import front_door
    from workflows.common import reap_id, run_local_activity, tell_placed

IN_TASK_LOSS = "in-task-loss"
"""Patch (deprecated since 1.2): see :func:`loss_in_task`."""


@workflow.defn(name="WorkerReap")
class WorkerReap:
    """Reap one worker: tasks ``lost``, services backfilled (CONTRACT.md rule 5)."""

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """A reap takes no signals: any is ignored, logged and counted."""
        front_door.unknown_signal(name, len(args))

    @workflow.run
    async def run(self, *args: Any) -> ReapResult:
        """Reap; ``args``: one ``ReapInput``. An input that does not parse reaps nothing
        (refused ``malformed input``; logged, counted)."""
        inp = front_door.start_input(ReapInput.model_validate, args)
        if inp is None:
            return ReapResult(refused="malformed input")
        req = ReapRequest(
            worker=inp.worker,
            reason=inp.reason,
            actor=inp.actor,
            forced=inp.forced,
            lost_after=inp.lost_after,
            at=workflow.now(),
            last_heartbeat_at=inp.last_heartbeat_at,
            dry_run=inp.dry_run,
        )
        summary = f"reap {inp.worker} ({'forced' if inp.forced else 'lost'})"
        # in-task-loss: the reap's transaction in the child's first workflow task.
        result: ReapResult = await run_local_activity(
            ReaperActivities.reap_worker, req, summary=summary
        )
        await tell_placed(result.replacements)
        return result


def loss_in_task() -> bool:
    """A loss is written and reaped inside workflow tasks (``in-task-loss``, issue 20): the
    ``lost`` record, the fleet check before a reap and the reap's transaction are local
    activities. Its patch is deprecated since 1.2 (always taken); the marker is recorded
    where a run first records a loss or reaps, as a 1.1.0 controller at peer version 1.1
    asks for it there during a rolling upgrade. Always ``True``."""
    workflow.deprecate_patch(IN_TASK_LOSS)
    return True


async def reap_step(live: LivenessState, seen: str | None) -> None:
    """The liveness's reap of its worker: run a ``WorkerReap`` child for
    ``live.reap_request``; a refused reap is retried later (rules 5 and 6).

    Args:
        live: the liveness's state (its reap request and retry time are updated).
        seen: the fleet's disruption state returned by this turn's state record, if any
            (read from Postgres otherwise).
    """
    t = live.timings
    req = live.reap_request
    assert req is not None and t is not None
    in_task = loss_in_task()
    if not live.reap_forced:
        # While the fleet is in full disruption, wait without starting a reap child per
        # attempt (the reap activity decides again, in its transaction, anyway).
        if seen is None:
            seen = (
                await run_local_activity(
                    ReaperActivities.fleet_status,
                    workflow.now(),
                    summary="fleet disruption check before reaping",
                )
            ).state
        if FleetState(seen) is FleetState.full:
            live.reap_retry_at = workflow.now() + timedelta(seconds=t.stall_after)
            workflow.logger.warning("reap of %s deferred: fleet in full disruption", live.worker)
            return
    live.reaps += 1
    try:
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
                in_task=in_task,
            ),
            id=reap_id(live.worker, live.reaps),
            static_summary=f"reap {live.worker}: {req.reason}",
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
        )
    except (WorkflowAlreadyStartedError, ChildWorkflowError) as exc:
        # That reap is still running (started by this liveness before it was reset to an
        # earlier point, activities/repair.py), or it ended without a result (terminated
        # or cancelled by an operator, timed out). Try again under the next id a heartbeat
        # interval later; the reap is one transaction, so a second finds done work done.
        live.reap_retry_at = workflow.now() + timedelta(seconds=t.heartbeat_interval)
        workflow.logger.warning("reap of %s: %s; retry later", live.worker, exc)
        return
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
