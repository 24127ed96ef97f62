"""``in-task-loss`` (issue 20): a silent worker's loss is written in the workflow task that
judges it and its reap runs in the reap child's first task (local activities), so a busy
controller's queue delays a replacement by fewer trips (1.0 scheduled activities). The reap
is the same: the tasks ``lost``, the service backfilled; the history replays.
Time-skipping server; timings as tests/workflows/test_reap.py (lost after 300 s)."""

from __future__ import annotations

import asyncpg
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from tests.support.fleet import fleet_with
from tests.support.scheduler import setup_service, task_states
from tests.support.upgrade import replay_failures, sequence
from workflows.common import liveness_id, reap_id
from workflows.reap import IN_TASK_LOSS

LOST = 300
LIVE = 20


def _tasks_from_deadline_to_reap(history: WorkflowHistory) -> list[str]:
    """The events from the last timer that fired before the reap child was started up to
    that start: what the liveness did between judging the loss and starting the reap."""
    seen = sequence(history)
    start = seen.index("START_CHILD_WORKFLOW_EXECUTION_INITIATED:WorkerReap")
    fired = max(i for i, f in enumerate(seen[:start]) if f == "TIMER_FIRED")
    return seen[fired : start + 1]


async def test_a_loss_is_written_and_reaped_in_one_task_each(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool
) -> None:
    async with fleet_with(time_env, pool) as fleet:
        a, b = fleet.name("a"), fleet.name("b")
        await setup_service(pool, "web", {a: ["t-a1"], b: []})
        await fleet.beat(a, tasks=["t-a1"])
        await fleet.beat(b, tasks=[])
        await fleet.advance(LOST + 20, beating={b: {"tasks": []}}, step=LIVE)
        assert (await fleet.state(a)).state == "lost"
        tasks = await task_states(pool)
        liveness = await time_env.client.get_workflow_handle(liveness_id(a)).fetch_history()
        reap = await time_env.client.get_workflow_handle(reap_id(a, 1)).fetch_history()
    # The task lost, its replacement on the live worker.
    assert tasks["t-a1"][1:3] == ("lost", "worker-lost")
    assert [v[0] for v in tasks.values() if v[3] == "t-a1"] == [b]
    judged = _tasks_from_deadline_to_reap(liveness)
    reaped = sequence(reap)
    # The deadline's own task writes `lost` and starts the reap: no activity between.
    assert "ACTIVITY_TASK_SCHEDULED:record_worker_state" not in judged, judged
    assert "MARKER_RECORDED:core_local_activity:record_worker_state" in judged, judged
    assert judged.count("WORKFLOW_TASK_COMPLETED") == 1, judged
    # The deprecated patch's marker, which a 1.1.0 controller asks for there.
    assert f"MARKER_RECORDED:core_patch:{IN_TASK_LOSS}" in judged, judged
    # The reap's transaction in the child's first task.
    assert "ACTIVITY_TASK_SCHEDULED:reap_worker" not in reaped, reaped
    first = reaped.index("WORKFLOW_TASK_COMPLETED")
    assert reaped[first + 1] == "MARKER_RECORDED:core_local_activity:reap_worker", reaped
    assert await replay_failures([liveness, reap]) == {}
