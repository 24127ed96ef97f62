"""``one-task-start`` (``reaper.core.policy.rollout``): where every peer is of this line, a new
worker is registered in the first workflow task of its liveness (the start-up read a local
activity, the ``running`` row written in the same task); where a peer may be of the previous
line (``REAPER_PEER_VERSION=1.0``) the first run keeps that line's commands. Either history
replays without the controller's setting (the SDK's ``Replayer`` has none): the patch marker,
not the setting, decides a replay. Time-skipping server."""

from __future__ import annotations

import asyncpg
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from reaper.core.policy import rollout
from reaper.core.policy.rollout import ONE_TASK_START, RELEASE_LINES
from tests.support.fleet import fleet_with
from tests.support.polling import eventually
from tests.support.upgrade import features, replay_failures
from workflows.common import liveness_id


@pytest.fixture(autouse=True)
def one_task_start_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests hold ``one-task-start`` on for the in-process controllers whatever the
    release's switch (``rollout.ONE_TASK_START_ON``) says (``rollout`` is passed through the
    sandbox, so the controllers see the same module)."""
    monkeypatch.setattr(rollout, "ONE_TASK_START_ON", True)


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


@pytest.mark.parametrize("peer", RELEASE_LINES)
async def test_a_registration_takes_one_workflow_task(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool, peer: str
) -> None:
    async with fleet_with(time_env, pool, peer_version=peer) as fleet:
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
    if peer == RELEASE_LINES[-1]:
        # One task; two when sdk-core heartbeats it (a read slower than 8 s under load).
        assert seen.count("WORKFLOW_TASK_COMPLETED") <= 2, seen
        assert "ACTIVITY_TASK_SCHEDULED" not in seen, seen
        assert _patched(history, ONE_TASK_START)
        # 16 with the previous line's commands; a heartbeat adds its task's 3 events.
        assert len(seen) <= 11 + 3 * (seen.count("WORKFLOW_TASK_COMPLETED") - 1), seen
    else:
        assert seen.count("WORKFLOW_TASK_COMPLETED") >= 2, seen
        assert "ACTIVITY_TASK_SCHEDULED" in seen, seen
        assert not _patched(history, ONE_TASK_START)
    # A replay has no controller setting: the marker decides (absent: the previous line).
    assert await replay_failures([history]) == {}


@pytest.mark.parametrize("peer", RELEASE_LINES)
async def test_a_retired_boot_beating_again_is_ignored_on_either_line(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool, peer: str
) -> None:
    """A beat of a retired boot starts a new first run (CONTRACT.md §5.1): at 1.1 its start-up
    read is the local activity, and the row it returns (``Retirement.registers_afresh``)
    ends the run with the beat ignored, as the activity's does at 1.0; the run replays."""
    async with fleet_with(time_env, pool, peer_version=peer) as fleet:
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
    assert _patched(history, ONE_TASK_START) == (peer == RELEASE_LINES[-1]), seen
    assert ("ACTIVITY_TASK_SCHEDULED:begin_liveness" in seen) == (peer != RELEASE_LINES[-1]), seen
    assert await replay_failures([history]) == {}
