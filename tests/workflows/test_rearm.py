"""``rearm-on-beat`` (issue 20): a healthy worker's deadline timer is re-armed in a beat's own
workflow task before it would fire, so it fires only once beats stop (1.0 fired it every
STALL_AFTER in a workflow task of its own). Time-skipping server."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import asyncpg
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from tests.support.fleet import fleet_with
from tests.support.polling import eventually
from workflows.common import liveness_id

HB, STALL = 10, 30
BEATS = 12


async def _events(env: WorkflowEnvironment, worker: str) -> Counter[str]:
    history = await env.client.get_workflow_handle(liveness_id(worker)).fetch_history()
    return Counter(EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in history.events)


async def test_the_timer_of_a_healthy_worker(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool
) -> None:
    async with fleet_with(
        time_env, pool, heartbeat_interval=HB, stall_after=STALL, lost_after=300
    ) as fleet:
        w = fleet.name("w")
        await fleet.beat(w)
        await fleet.advance(BEATS * HB, beating={w: {}}, step=HB)
        await fleet.beat(w)
        seen = await _events(time_env, w)
        assert (await fleet.state(w)).state == "running"
        beats = seen["WORKFLOW_EXECUTION_SIGNALED"]
        assert beats >= BEATS
        # Re-armed in every other beat's task (STALL_AFTER is three intervals), never
        # fired. (What that saves in workflow tasks is bench metric 9's, on the dev server:
        # the test server groups a fire with a beat at the same instant.)
        assert seen["TIMER_FIRED"] == 0, seen
        assert BEATS // 2 - 1 <= seen["TIMER_CANCELED"] <= BEATS // 2 + 1, seen
        # Beats stop: the timer last armed fires on time and the worker is stalled.
        due = await time_env.get_current_time() + timedelta(seconds=STALL)
        await fleet.advance(STALL - 2, step=HB)
        assert (await fleet.state(w)).state == "running"
        await fleet.advance(3, step=HB)
        await eventually(
            lambda: pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", w),
            lambda s: s == "stalled",
            what="stalled at its deadline",
        )
        since = await pool.fetchval("SELECT state_since FROM reaper.workers WHERE name = $1", w)
        assert since <= due + timedelta(seconds=2)
