"""``in-task-loss`` (``reaper.core.policy.rollout``): where every peer is of this line, a silent
worker's loss is written in the workflow task that judges it and its reap runs in the reap
child's first task (local activities), so a busy controller's queue delays a replacement
by fewer trips; where a peer may be of the previous line (``REAPER_PEER_VERSION=1.0``) the
previous line's activities are kept. Both lines reap the same: the tasks ``lost``, the
service backfilled. Either history replays without the controller's setting. Time-skipping
server; timings as tests/workflows/test_reap.py (lost after 300 s)."""

from __future__ import annotations

import os

import asyncpg
import pytest
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from reaper.core.policy.rollout import IN_TASK_LOSS, RELEASE_LINES
from tests.support.fleet import fleet_with
from tests.support.releases import HISTORIES
from tests.support.scheduler import setup_service, task_states
from tests.support.upgrade import replay_failures, sequence
from workflows.common import liveness_id, reap_id

LOST = 300
LIVE = 20


def _tasks_from_deadline_to_reap(history: WorkflowHistory) -> list[str]:
    """The events from the last timer that fired before the reap child was started up to
    that start: what the liveness did between judging the loss and starting the reap."""
    seen = sequence(history)
    start = seen.index("START_CHILD_WORKFLOW_EXECUTION_INITIATED:WorkerReap")
    fired = max(i for i, f in enumerate(seen[:start]) if f == "TIMER_FIRED")
    return seen[fired : start + 1]


@pytest.mark.parametrize("peer", RELEASE_LINES)
async def test_a_loss_is_written_and_reaped_in_one_task_each_on_this_line(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool, peer: str
) -> None:
    async with fleet_with(time_env, pool, peer_version=peer) as fleet:
        a, b = fleet.name("a"), fleet.name("b")
        await setup_service(pool, "web", {a: ["t-a1"], b: []})
        await fleet.beat(a, tasks=["t-a1"])
        await fleet.beat(b, tasks=[])
        await fleet.advance(LOST + 20, beating={b: {"tasks": []}}, step=LIVE)
        assert (await fleet.state(a)).state == "lost"
        tasks = await task_states(pool)
        liveness = await time_env.client.get_workflow_handle(liveness_id(a)).fetch_history()
        reap = await time_env.client.get_workflow_handle(reap_id(a, 1)).fetch_history()
    # The same reap on either line: the task lost, its replacement on the live worker.
    assert tasks["t-a1"][1:3] == ("lost", "worker-lost")
    assert [v[0] for v in tasks.values() if v[3] == "t-a1"] == [b]
    judged = _tasks_from_deadline_to_reap(liveness)
    reaped = sequence(reap)
    this_line = peer == RELEASE_LINES[-1]
    # The deadline's own task writes `lost` and starts the reap: no activity between.
    assert ("ACTIVITY_TASK_SCHEDULED:record_worker_state" in judged) is not this_line, judged
    assert ("MARKER_RECORDED:core_local_activity:record_worker_state" in judged) is this_line
    assert judged.count("WORKFLOW_TASK_COMPLETED") == (1 if this_line else 2), judged
    assert (f"MARKER_RECORDED:core_patch:{IN_TASK_LOSS}" in judged) is this_line, judged
    # The reap's transaction in the child's first task.
    assert ("ACTIVITY_TASK_SCHEDULED:reap_worker" in reaped) is not this_line, reaped
    assert ("MARKER_RECORDED:core_local_activity:reap_worker" in reaped) is this_line, reaped
    first = reaped.index("WORKFLOW_TASK_COMPLETED")
    assert (reaped[first + 1] == "MARKER_RECORDED:core_local_activity:reap_worker") is this_line
    # A replay has no controller setting: the marker and the reap's input decide.
    assert await replay_failures([liveness, reap]) == {}
    if this_line and os.environ.get("REAPER_RECORD_HISTORIES") == "1":
        (HISTORIES / "liveness-in-task-loss.json").write_text(liveness.to_json())
        (HISTORIES / "reap-in-task-loss.json").write_text(reap.to_json())
