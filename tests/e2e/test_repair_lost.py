"""A stuck liveness of a ``lost`` worker is repaired too, so the worker is still retired
automatically (CONTRACT.md §5.1: "a worker lost for RETIRE_AFTER ... is retired").

A lost worker's liveness still has work: its automatic retirement. Its row says ``lost``, so
the suspects of ``running`` and ``stalled`` rows (a last heartbeat older than a working
liveness allows) never include it; a ``lost`` row whose retirement is overdue
(``policy.repair.retire_cutoff``) does (breaker finding, 2026-12-02: with only the first
kind of suspect the stuck run reached workflow task attempt 7 and the worker was never
retired).

Made as tests/e2e/test_repair.py makes its stuck livenesses (tests/support/diverging.py,
``late-*``): the diverging controller judges the dead worker lost, then stops; reaper's takes
over with ``RETIRE_AFTER`` 10 s. A dev server of the test's own (``long_runs``).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from activities import ReaperActivities
from tests.support.agents import Agents
from tests.support.controller import controller, make_settings, start_monitor
from tests.support.diverging import DivergingLiveness, diverged, events_of
from tests.support.polling import eventually
from worker import ControllerHooks
from workflows import ALL_WORKFLOWS, WorkerLiveness
from workflows.common import collector_id, fleet_monitor_id, liveness_id, reap_id

pytestmark = pytest.mark.own_stack
"""A dev server of its own (``long_runs``): make test runs it beside the smoke runs."""

TIMINGS = dict(
    heartbeat_interval=1,
    stall_after=3,
    lost_after=6,
    missing_ttl=3,
    resync_interval=1,
    disruption_threshold=1.0,
    retire_after=10,
)


async def test_a_stuck_liveness_of_a_lost_worker_is_repaired_and_retires_it(
    long_runs: Client, pool
) -> None:
    client = long_runs
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    w = f"late-{uuid.uuid4().hex[:6]}"
    ok = f"ok-{uuid.uuid4().hex[:6]}"  # beats throughout: the fleet is never all unhealthy
    settings = make_settings(**TIMINGS)
    diverging = [DivergingLiveness if c is WorkerLiveness else c for c in ALL_WORKFLOWS]
    try:
        with Agents(client, tq, interval=1.0) as agents:
            agents.reports[w] = {"containers": [], "volumes": [], "tasks": []}
            agents.reports[ok] = {"containers": [], "volumes": [], "tasks": []}
            async with Worker(
                client,
                task_queue=tq,
                workflows=diverging,
                activities=ReaperActivities(pool, settings).all(),
                interceptors=[ControllerHooks()],
                sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
            ):
                await eventually(
                    lambda: events_of(client, liveness_id(w)),
                    diverged,
                    timeout=60,
                    what=f"{w}'s liveness diverged",
                )
                del agents.reports[w]  # the worker dies
                await eventually(
                    lambda: pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", w),
                    lambda s: s == "lost",
                    timeout=60,
                    poll=0.2,
                    what=f"{w} lost",
                )
            async with controller(client, pool, settings, tq):
                await start_monitor(client, settings, tq)
                await eventually(
                    lambda: pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", w),
                    lambda s: s == "retired",
                    timeout=120,
                    poll=1.0,
                    what=f"{w} retired automatically after its liveness was repaired",
                )
        reasons = await pool.fetch(
            "SELECT reason FROM reaper.events WHERE worker = $1 AND action = 'repaired'", w
        )
        assert len(reasons) == 1 and "Nondeterminism" in reasons[0]["reason"], reasons
    finally:
        ids = [liveness_id(w), collector_id(w), reap_id(w, 1), fleet_monitor_id(tq)]
        ids += [liveness_id(ok), collector_id(ok)]
        for wid in ids:
            try:
                await client.get_workflow_handle(wid).terminate("test over")
            except Exception:
                pass
