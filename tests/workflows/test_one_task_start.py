"""``one-task-start`` (issue 20): a new worker is registered in the first workflow task of its
liveness (the start-up read a local activity, the ``running`` row written in the same task);
the run records the deprecated patch's marker, which a 1.1.0 controller serving beside this
release asks for, and replays. Time-skipping server."""

from __future__ import annotations

import asyncpg
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from tests.support.fleet import fleet_with
from tests.support.polling import eventually
from tests.support.upgrade import features, replay_failures
from workflows.common import liveness_id
from workflows.run_start import ONE_TASK_START


def _until_first_timer(history: WorkflowHistory) -> list[str]:
    """Event type names of a liveness's history up to its first ``TimerStarted`` (the
    deadline armed once the worker is registered)."""
    names: list[str] = []
    for e in history.events:
        names.append(EventType.Name(e.event_type).removeprefix("EVENT_TYPE_"))
        if names[-1] == "TIMER_STARTED":
            break
    return names


def _patched(history: WorkflowHistory, patch: str) -> bool:
    """Whether a history holds the patch marker ``patch``."""
    return f"MARKER_RECORDED:core_patch:{patch}" in features(history)


async def test_a_registration_takes_one_workflow_task(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool
) -> None:
    async with fleet_with(time_env, pool) as fleet:
        w = fleet.name("w")
        await fleet.beat(w)
        await eventually(
            lambda: pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", w),
            lambda s: s == "running",
            what="registered",
        )
        handle = time_env.client.get_workflow_handle(liveness_id(w))
        await eventually(
            handle.fetch_history,
            lambda h: "TIMER_STARTED" in _until_first_timer(h),
            what="deadline armed",
        )
        history = await handle.fetch_history()
    seen = _until_first_timer(history)
    # One task; two when sdk-core heartbeats it (a read slower than 8 s under load).
    assert seen.count("WORKFLOW_TASK_COMPLETED") <= 2, seen
    assert "ACTIVITY_TASK_SCHEDULED" not in seen, seen
    assert _patched(history, ONE_TASK_START)
    # 16 with 1.0's commands; a heartbeat adds its task's 3 events.
    assert len(seen) <= 11 + 3 * (seen.count("WORKFLOW_TASK_COMPLETED") - 1), seen
    assert await replay_failures([history]) == {}


async def test_a_retired_boot_beating_again_is_ignored(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool
) -> None:
    """A beat of a retired boot starts a new first run (CONTRACT.md §5.1): its start-up read
    is the local activity, and the row it returns (``Retirement.registers_afresh``) ends the
    run with the beat ignored; the run replays."""
    async with fleet_with(time_env, pool) as fleet:
        w = fleet.name("w")
        await fleet.beat(w, containers=[])
        handle = time_env.client.get_workflow_handle(liveness_id(w))
        await handle.signal("retire", {"reason": "decommission"})
        await eventually(
            lambda: pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", w),
            lambda s: s == "retired",
            what="retired",
        )
        first = await eventually(
            handle.describe, lambda d: d.close_time is not None, what="liveness ended"
        )
        st = await fleet.beat(w, containers=["c-late"])  # the same boot
        assert st.state == "retired" and st.ignored >= 1, st
        again = await eventually(
            handle.describe,
            lambda d: d.run_id != first.run_id and d.close_time is not None,
            what="the retired boot's run ended",
        )
        assert await pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", w) == (
            "retired"
        )
        assert (
            await pool.fetchval("SELECT count(*) FROM reaper.unknown_handles WHERE worker = $1", w)
            == 0
        )
        history = await time_env.client.get_workflow_handle(
            liveness_id(w), run_id=again.run_id
        ).fetch_history()
    seen = features(history)
    assert _patched(history, ONE_TASK_START), seen
    assert "ACTIVITY_TASK_SCHEDULED:begin_liveness" not in seen, seen
    assert await replay_failures([history]) == {}
