"""Several controllers (issue 11): replicas of ``python worker.py`` on one task queue, one
Temporal, one Postgres. Work is shared; the SIGKILL of a replica loses nothing, doubles
nothing and stalls no healthy worker; the fleet monitor stays a singleton.

Real processes on the session's dev server, time real, polled with deadlines. Who did what is
read from the histories: every ``WorkflowTaskStarted`` and ``ActivityTaskStarted`` event names
the identity (``pid@host``) of the replica that took the task.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter

import asyncpg
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus

from tests.support.agents import Agents
from tests.support.controller import ControllerProcess
from tests.support.heartbeats import beats_handled, query_state
from tests.support.polling import eventually
from workflows.common import fleet_monitor_id

STICKY_S = 2
TIMINGS = {
    "REAPER_HEARTBEAT_INTERVAL": "1s",
    # Wide enough for a killed replica's workflows to move: the sticky timeout for those
    # cached there, the workflow task timeout (10 s) for one it was running when killed.
    "REAPER_STALL_AFTER": "12s",
    "REAPER_LOST_AFTER": "60s",
    "REAPER_MISSING_TTL": "4s",
    "REAPER_RESYNC_INTERVAL": "2s",
    "REAPER_STICKY_TIMEOUT": f"{STICKY_S}s",
}
WORKERS = 6
STARTED = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED: "workflow_task_started_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED: "activity_task_started_event_attributes",
}


@pytest.fixture
def replicas(dev_env, db_url, tmp_path) -> list[ControllerProcess]:
    address = dev_env.client.service_client.config.target_host
    a = ControllerProcess(address, db_url, tmp_path / "replica-a.log", TIMINGS)
    b = ControllerProcess(address, db_url, tmp_path / "replica-b.log", TIMINGS, a.task_queue)
    yield [a, b]
    for proc in (a, b):
        proc.stop()


async def task_takers(client: Client, task_queue: str) -> dict[str, Counter[str]]:
    """Per identity, how many workflow tasks and activity tasks it took on ``task_queue``
    (every run of every workflow, continued-as-new ones included)."""
    took: dict[str, Counter[str]] = {}
    async for wf in client.list_workflows(f"TaskQueue = '{task_queue}'"):
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        for event in history.events:
            if event.event_type in STARTED:
                identity = getattr(event, STARTED[event.event_type]).identity
                kind = "workflow" if "WORKFLOW" in EventType.Name(event.event_type) else "activity"
                took.setdefault(identity, Counter())[kind] += 1
    return took


async def last_workflow_task_taker(client: Client, workflow_id: str) -> str:
    """The identity of the replica that took the workflow's latest workflow task. A run that
    has just continued as new has taken none yet: wait for its first."""

    async def takers() -> list[str]:
        history = await client.get_workflow_handle(workflow_id).fetch_history()
        return [
            e.workflow_task_started_event_attributes.identity
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
        ]

    found = await eventually(takers, bool, timeout=30, what=f"a workflow task of {workflow_id}")
    return found[-1]


async def destroyed(pool: asyncpg.Pool) -> Counter[str]:
    return Counter(
        r[0]
        for r in await pool.fetch("SELECT handle FROM reaper.events WHERE action = 'destroyed'")
    )


async def test_two_replicas_share_work_and_a_sigkilled_one_loses_doubles_and_stalls_nothing(
    dev_env, pool, replicas
):
    client = dev_env.client
    a, b = replicas
    sfx = uuid.uuid4().hex[:6]
    workers = [f"w{i}-{sfx}" for i in range(WORKERS)]
    held = {w: [f"c-{w}-{j}" for j in range(4)] for w in workers}
    for w, handles in held.items():
        await pool.executemany(
            "INSERT INTO reaper.containers (handle, worker) VALUES ($1, $2)",
            [(h, w) for h in handles],
        )
    a.start()
    b.start()
    with Agents(client, a.task_queue) as agents:
        agents.reports = {w: {"containers": list(h)} for w, h in held.items()}
        await eventually(
            lambda: pool.fetchval("SELECT count(*) FROM reaper.workers WHERE state = 'running'"),
            lambda n: n == WORKERS,
            timeout=60,
            what=f"{WORKERS} workers running\n{a.tail()}\n{b.tail()}",
        )
        for w in workers:
            await beats_handled(client, w, 2)

        # The fleet monitor is one workflow, however many replicas started it.
        fleet_runs = [
            wf.status
            async for wf in client.list_workflows(
                f"WorkflowId = '{fleet_monitor_id(a.task_queue)}'"
            )
        ]
        assert fleet_runs.count(WorkflowExecutionStatus.RUNNING) == 1, fleet_runs
        assert set(fleet_runs) <= {
            WorkflowExecutionStatus.RUNNING,
            WorkflowExecutionStatus.CONTINUED_AS_NEW,
        }, fleet_runs

        # w0 drops a handle; once it is marked, the replica that runs w0's collector dies
        # (SIGKILL) while the collector waits out the TTL: the other one must destroy it.
        w0, w1 = workers[0], workers[1]
        agents.reports[w0] = {"containers": held[w0][1:]}
        await eventually(
            lambda: pool.fetchval(
                "SELECT missing_since FROM reaper.containers WHERE handle = $1", held[w0][0]
            ),
            lambda v: v is not None,
            timeout=30,
            what="w0's dropped handle marked",
        )
        taker = await last_workflow_task_taker(client, f"gc-{w0}")
        victim, survivor = (a, b) if taker == a.identity else (b, a)
        assert taker == victim.identity, (taker, a.identity, b.identity)
        seq_at_kill = {w: (await query_state(client, w)).last_seq for w in workers}
        victim.kill()
        killed_at = time.monotonic()
        agents.reports[w1] = {"containers": held[w1][1:]}  # new work after the kill

        moved_after: dict[str, float] = {}

        async def all_beating_again() -> bool:
            states = await asyncio.gather(*(query_state(client, w) for w in workers))
            for s, w in zip(states, workers, strict=True):
                if (s.last_seq or 0) > seq_at_kill[w]:
                    moved_after.setdefault(w, time.monotonic() - killed_at)
            return len(moved_after) == len(workers)

        await eventually(
            all_beating_again, bool, timeout=30, poll=0.1, what="every liveness moving again"
        )
        recovery = sorted(round(t, 1) for t in moved_after.values())
        await eventually(
            lambda: pool.fetchval(
                "SELECT count(*) FROM reaper.containers WHERE handle = ANY($1::text[])",
                [held[w0][0], held[w1][0]],
            ),
            lambda n: n == 0,
            timeout=60,
            what=f"both dropped handles destroyed\n{survivor.tail()}",
        )
        for w in workers:  # more beats, resyncs and retries: still nothing doubled
            await beats_handled(client, w, 3)
        states = {
            r["name"]: r["state"]
            for r in await pool.fetch("SELECT name, state FROM reaper.workers")
        }
    print(f"replica SIGKILLed: each liveness moving again after (s) {recovery}")
    assert states == {w: "running" for w in workers}
    assert not await pool.fetch(
        "SELECT * FROM reaper.events WHERE kind = 'worker' AND reason NOT LIKE 'new -> %'"
    ), "a healthy worker changed state"
    assert await destroyed(pool) == Counter([held[w0][0], held[w1][0]])
    remaining = {r[0] for r in await pool.fetch("SELECT handle FROM reaper.containers")}
    assert remaining == {h for w in workers for h in held[w]} - {held[w0][0], held[w1][0]}
    took = await task_takers(client, a.task_queue)
    for proc in (a, b):
        assert took.get(proc.identity, Counter())["activity"] > 0, (proc.identity, took)
        assert took.get(proc.identity, Counter())["workflow"] > 0, (proc.identity, took)
    assert set(took) == {a.identity, b.identity}, took
