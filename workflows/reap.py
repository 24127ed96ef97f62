"""``WorkerReap``: one reap of a lost or force-reaped worker (``reap-{worker}-{n}``).

A child of the worker's liveness. The reap itself is one transaction in one activity, so a
heartbeat arriving meanwhile, or a controller crash at any point, leaves no task half-reaped;
the workflow then tells each worker that received a replacement to pick it up.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities import ReaperActivities
    from activities.types import ReapRequest
    from reaper.core.models import ReapInput, ReapResult
    from workflows.common import run_activity, tell_placed


@workflow.defn(name="WorkerReap")
class WorkerReap:
    """Reap one worker: tasks ``lost``, services backfilled (CONTRACT.md rule 5)."""

    @workflow.run
    async def run(self, inp: ReapInput) -> ReapResult:
        result: ReapResult = await run_activity(
            ReaperActivities.reap_worker,
            ReapRequest(
                worker=inp.worker,
                reason=inp.reason,
                actor=inp.actor,
                forced=inp.forced,
                lost_after=inp.lost_after,
                at=workflow.now(),
                last_heartbeat_at=inp.last_heartbeat_at,
                dry_run=inp.dry_run,
            ),
            summary=f"reap {inp.worker} ({'forced' if inp.forced else 'lost'})",
        )
        await tell_placed(result.replacements)
        return result
