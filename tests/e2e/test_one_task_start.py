"""``one-task-start`` (``reaper.core.policy.rollout``) on the dev server: a first run's
start-up read is a local activity, so what arrives while that read is slow waits in the
run's first workflow task, or in the later tasks with which sdk-core keeps that task alive
(a workflow task heartbeat: past 80 % of the 10 s task timeout, the task completes with no
result of the local activity and a new one is forced). Those beats and operator signals
must be applied once the read is back, as the run received them, and a replay of the
history (after an eviction: a controller that caches one workflow; the SDK's ``Replayer``)
must take the same path.

Postgres is made slow by holding an ``ACCESS EXCLUSIVE`` lock on ``reaper.workers`` from
another connection (the read joins it), released once the beats have arrived.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.service import RPCError

from reaper.core.policy.rollout import RELEASE_LINES
from tests.support.controller import evicting_controller, make_settings
from tests.support.heartbeats import beat, failed_tasks, query_state, send
from tests.support.polling import eventually
from tests.support.upgrade import features, replay_failures
from workflows.common import collector_id, liveness_id
from workflows.run_start import ONE_TASK_START

TIMINGS = dict(heartbeat_interval=2.0, stall_after=6, lost_after=60, missing_ttl=6)


@asynccontextmanager
async def workers_locked(pool: asyncpg.Pool, table: str = "workers") -> AsyncIterator[None]:
    """``reaper.{table}`` locked against every read (``ACCESS EXCLUSIVE``) until exit."""
    assert table in ("workers", "agent_keys")
    async with pool.acquire() as conn:
        tr = conn.transaction()
        await tr.start()
        try:
            await conn.execute(f"LOCK TABLE reaper.{table} IN ACCESS EXCLUSIVE MODE")
            yield
        finally:
            await tr.rollback()


def sequence(history: WorkflowHistory) -> list[str]:
    """A history's events, by type name (markers with their name)."""
    out = []
    for e in history.events:
        name = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_")
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            name += ":" + e.marker_recorded_event_attributes.marker_name
        out.append(name)
    return out


async def finish(client: Client, workers: list[str]) -> None:
    """Terminate the workers' livenesses and collectors (some may never have started)."""
    for wid in [x for n in workers for x in (liveness_id(n), collector_id(n))]:
        with contextlib.suppress(RPCError):
            await client.get_workflow_handle(wid).terminate("test over")


async def timed_out_tasks(client: Client, workflow_id: str) -> int:
    """Workflow tasks of the workflow, over all its runs, that timed out (no worker answered
    within the task timeout, 10 s)."""
    n = 0
    async for wf in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        history = await client.get_workflow_handle(workflow_id, run_id=wf.run_id).fetch_history()
        n += count(history, EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT)
    return n


async def registered_with_every_beat(client: Client, worker: str, last_seq: int) -> None:
    """Wait until ``worker`` is ``running`` with beat ``last_seq`` handled, none rejected."""
    st = await eventually(
        lambda: query_state(client, worker),
        lambda s: s.state == "running" and s.last_seq == last_seq,
        timeout=20,
        what="registered with every beat",
    )
    assert st.rejected == 0, st


def count(history: WorkflowHistory, event: int) -> int:
    return sum(1 for e in history.events if e.event_type == event)


async def replays(history: WorkflowHistory) -> None:
    assert await replay_failures([history]) == {}


async def test_beats_and_a_drain_during_a_slow_first_read(dev_env, pool) -> None:
    """The start-up read of a new worker waits on a lock of ``reaper.workers`` past the
    workflow task heartbeat (80 % of 10 s) while beats and a drain arrive in later tasks:
    once released, every beat and the drain are applied, no workflow task fails, and the
    first run replays."""
    client: Client = dev_env.client
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    suffix = uuid.uuid4().hex[:6]
    w = f"slow-{suffix}"
    settings = make_settings(**TIMINGS)
    async with evicting_controller(client, pool, settings, tq):
        handle = client.get_workflow_handle(liveness_id(w))
        async with workers_locked(pool):
            started = await send(client, tq, beat(w, 0))
            # The first task outlives 80 % of its timeout: sdk-core completes it unfinished.
            await eventually(
                handle.fetch_history,
                lambda h: count(h, EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED) >= 1,
                timeout=15,
                what="the first workflow task heartbeated",
            )
            for seq in (1, 2):
                await send(client, tq, beat(w, seq))
            await handle.signal("drain", {"reason": "kernel upgrade", "actor": "ops"})
            await eventually(
                handle.fetch_history,
                lambda h: count(h, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED) >= 4,
                timeout=10,
                what="beats and drain received",
            )
        await registered_with_every_beat(client, w, 2)
        row = await eventually(
            lambda: pool.fetchrow(
                "SELECT state, draining, last_seq FROM reaper.workers WHERE name = $1", w
            ),
            lambda r: r is not None and r["draining"],
            timeout=20,
            what="drained",
        )
        assert row["state"] == "running", row
        history = await client.get_workflow_handle(
            liveness_id(w), run_id=started.result_run_id
        ).fetch_history()
    assert f"MARKER_RECORDED:core_patch:{ONE_TASK_START}" in features(history)
    assert await failed_tasks(client, liveness_id(w)) == []
    await replays(history)
    await finish(client, [w])


async def blocked_reads(pool: asyncpg.Pool) -> int:
    """Start-up reads (``begin_liveness``) waiting for the lock of :func:`workers_locked`."""
    n: int = await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
        "%LEFT JOIN reaper.agent_keys%",
    )
    return n


CACHE_PRESSURE_TIMEOUTS = 1
"""Workflow tasks of the two livenesses that may time out (10 s each) in
:func:`test_beats_that_arrive_during_the_first_tasks_read`. At 1.1 a new worker's first
workflow task holds the start-up read as a local activity; when a full cache (here one
workflow) wants that run evicted for another workflow's task while the read waits on
Postgres, sdk-core completes the task with the patch marker alone and the next one (the
early beats) times out once: a registration about 10 s late, nothing lost or failed (4 of 4
runs). At 1.0 the read is an activity, and the local activity that writes the row can meet
the same eviction (1 of 5 runs). A controller sized as docs/capacity.md says never has a
full cache (10,000 workflows, about 1,330 workers a replica)."""


async def test_beats_that_arrive_during_the_first_tasks_read(dev_env, pool) -> None:
    """The start-up read of a new worker waits on a lock of ``reaper.agent_keys`` while beats
    and a drain arrive and another liveness needs the controller's one cached workflow:
    every beat and the drain are applied, nothing fails or needs a second try, and the
    first run replays."""
    client: Client = dev_env.client
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    suffix = uuid.uuid4().hex[:6]
    w, other = f"quick-{suffix}", f"other-{suffix}"
    settings = make_settings(**TIMINGS)
    async with evicting_controller(client, pool, settings, tq):
        await send(client, tq, beat(other, 0))
        await eventually(
            lambda: query_state(client, other), lambda s: s.state == "running", what="other"
        )
        handle = client.get_workflow_handle(liveness_id(w))
        async with workers_locked(pool, "agent_keys"):
            started = await send(client, tq, beat(w, 0))
            await eventually(lambda: blocked_reads(pool), lambda n: n >= 1, what="read blocked")
            for seq in (1, 2):
                await send(client, tq, beat(w, seq))
            await handle.signal("drain", {"reason": "kernel upgrade", "actor": "ops"})
            await send(client, tq, beat(other, 1))
        for seq in (3, 4):
            await send(client, tq, beat(other, seq))
            await send(client, tq, beat(w, seq))
        await registered_with_every_beat(client, w, 4)
        await eventually(
            lambda: pool.fetchval("SELECT draining FROM reaper.workers WHERE name = $1", w),
            lambda d: d is True,
            timeout=20,
            what="drained",
        )
        history = await client.get_workflow_handle(
            liveness_id(w), run_id=started.result_run_id
        ).fetch_history()
    for wid in (liveness_id(w), liveness_id(other)):
        assert await failed_tasks(client, wid) == [], wid
    await replays(history)
    timed_out = [await timed_out_tasks(client, liveness_id(n)) for n in (w, other)]
    await finish(client, [w, other])
    assert sum(timed_out) <= CACHE_PRESSURE_TIMEOUTS, (timed_out, sequence(history))


async def runs(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    """The history of every run of ``workflow_id``, first to last."""
    out = []
    async for wf in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        out.append(await client.get_workflow_handle(workflow_id, run_id=wf.run_id).fetch_history())
    return sorted(out, key=lambda h: h.events[0].event_time.ToDatetime())


@pytest.mark.parametrize(
    ("started", "continued"),
    [(RELEASE_LINES[-1], RELEASE_LINES[-2]), (RELEASE_LINES[-2], RELEASE_LINES[-1])],
)
async def test_a_run_started_at_one_peer_version_continues_at_the_other(
    dev_env, pool, started: str, continued: str
) -> None:
    """A controller at one peer version registers a worker and stops; one at the other takes
    the liveness on (and its next runs, where the dev server suggests a continue-as-new): no
    failed task, the first run carries the marker, and every run replays without a setting
    (a run of a lone WorkflowExecutionStarted is left out: the SDK's Replayer does not return
    from one)."""
    client: Client = dev_env.client
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    w = f"h-{uuid.uuid4().hex[:6]}"
    async with evicting_controller(client, pool, make_settings(peer_version=started), tq):
        for seq in (0, 1):
            await send(client, tq, beat(w, seq))
        await eventually(lambda: query_state(client, w), lambda s: s.last_seq == 1, what="beat 1")
    async with evicting_controller(client, pool, make_settings(peer_version=continued), tq):
        for seq in range(2, 9):
            await send(client, tq, beat(w, seq))
        st = await eventually(
            lambda: query_state(client, w), lambda s: s.last_seq == 8, what="beat 8"
        )
        histories = await runs(client, liveness_id(w))
        failed = await failed_tasks(client, liveness_id(w))
    await finish(client, [w])
    marker = f"MARKER_RECORDED:core_patch:{ONE_TASK_START}"
    assert st.state == "running"
    assert failed == []
    assert marker in features(histories[0])
    assert not any(marker in features(h) for h in histories[1:])
    for h in histories:
        if any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for e in h.events):
            await replays(h)
