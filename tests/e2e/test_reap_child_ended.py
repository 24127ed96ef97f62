"""A reap child that ends without a result (an operator terminates it while it is stuck on
a locked table) is tried again under the next id; the liveness runs on (rule 5, rule 8).

A reap stuck on a locked ``reaper.tasks`` table shows in the Web UI as a workflow retrying
an activity; terminating it is an ordinary operator reflex. Before, the child's error
escaped the liveness's ``run`` and failed the run (breaker finding, 2026-12-02); now
``workflows.reap.reap_step`` retries a heartbeat interval later, and the reap happens once
the table is free.

Dev server (session), real Postgres, in-process controller, raw ``temporal`` CLI.
"""

from __future__ import annotations

import uuid

import asyncpg
from temporalio.client import WorkflowExecutionStatus

from tests.support import cli
from tests.support.controller import controller, make_settings
from tests.support.heartbeats import register_with_task
from tests.support.polling import eventually
from workflows.common import collector_id, liveness_id, reap_id

TIMINGS = dict(heartbeat_interval=1, stall_after=3, lost_after=6, missing_ttl=3, resync_interval=1)


async def _describe(client, wid):
    try:
        return await client.get_workflow_handle(wid).describe()
    except Exception:
        return None


async def test_a_terminated_reap_is_tried_again_and_the_liveness_runs_on(dev_env, pool, db_url):
    client = dev_env.client
    address = client.service_client.config.target_host
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    suffix = uuid.uuid4().hex[:6]
    w = f"rt-{suffix}"
    async with controller(client, pool, make_settings(**TIMINGS), tq):
        try:
            task = await register_with_task(client, pool, tq, w, f"svc-{suffix}")
            locker = await asyncpg.connect(db_url)
            tx = locker.transaction()
            await tx.start()
            await locker.execute("LOCK TABLE reaper.tasks IN EXCLUSIVE MODE")
            try:
                await cli.signal(address, liveness_id(w), "force_reap", '{"reason": "test"}')
                await eventually(
                    lambda: _describe(client, reap_id(w, 1)),
                    lambda d: d is not None and d.status == WorkflowExecutionStatus.RUNNING,
                    timeout=30,
                    what="the reap started (and stuck on the lock)",
                )
                await cli.terminate(address, reap_id(w, 1), "stuck reap")
                desc = await eventually(
                    lambda: client.get_workflow_handle(liveness_id(w)).describe(),
                    lambda d: (
                        d.status != WorkflowExecutionStatus.RUNNING
                        or d.raw_description.pending_workflow_task.attempt == 0
                    ),
                    timeout=10,
                    what="the liveness after the terminate",
                )
                # A closed run says so at once; a running one is judged after the reap.
                assert desc.status == WorkflowExecutionStatus.RUNNING, (
                    f"the liveness run is {desc.status.name} after its reap child was terminated"
                )
            finally:
                await tx.rollback()
                await locker.close()
            await eventually(
                lambda: pool.fetchval("SELECT state FROM reaper.tasks WHERE id = $1", task),
                lambda s: s == "lost",
                timeout=30,
                poll=0.5,
                what="the task reaped after all",
            )
            desc = await client.get_workflow_handle(liveness_id(w)).describe()
            assert desc.status == WorkflowExecutionStatus.RUNNING, desc.status
        finally:
            for wid in (liveness_id(w), collector_id(w), reap_id(w, 1), reap_id(w, 2)):
                try:
                    await client.get_workflow_handle(wid).terminate("test over")
                except Exception:
                    pass
