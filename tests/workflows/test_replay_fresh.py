"""Histories recorded by today's code replay on today's code (every patch taken): a
liveness and a collector through beats, a mark, a stall and a return, and a fleet monitor."""

from __future__ import annotations

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from reaper.core.contract import liveness_id
from tests.support.fleet import fleet_with
from tests.support.scheduler import insert
from workflows import ALL_WORKFLOWS
from workflows.common import collector_id, fleet_monitor_id


async def test_todays_histories_replay_on_todays_code(time_env, pool):
    async with fleet_with(time_env, pool, monitor=True) as fleet:
        a = fleet.name("a")
        await insert(pool, "containers", a, ["c-1", "c-2"])
        await fleet.beat(a, containers=["c-1", "c-2"])
        await fleet.beat(a, containers=["c-1"])
        await fleet.advance(40, beating={a: {"containers": ["c-1"]}})
        await insert(pool, "containers", a, ["c-3"])
        await fleet.advance(30, beating={a: {"containers": ["c-1"]}})
        await fleet.advance(40)  # a stalls
        await fleet.beat(a, containers=["c-1"])  # and returns
        replayer = Replayer(workflows=ALL_WORKFLOWS, data_converter=pydantic_data_converter)
        for wid in (liveness_id(a), collector_id(a), fleet_monitor_id(fleet.tq)):
            history = await fleet.client.get_workflow_handle(wid).fetch_history()
            result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
            assert result.replay_failure is None, (wid, result.replay_failure)
