"""A `state` query that races a deadline timer or a beat must not leave a liveness stuck.

The chaos campaign's stuck livenesses (docs/chaos.md, "What the campaigns found"), reproduced
without any server restart: a ``state`` query sent while the liveness has no workflow task
pending is handed by the server to a worker on its own, as a *legacy query task*. When no
worker polls at once (controller W1 has stopped) and meanwhile the deadline timer fires or a
beat lands, the worker that takes the query (W2) gets a history that ends in TIMER_FIRED,
WORKFLOW_TASK_SCHEDULED or SIGNALED, with no new WORKFLOW_TASK_STARTED. sdk-core applies
those events for the query with ``workflow.now()`` still at the *previous* task's start (its
clock advances only on a WorkflowTaskStarted event), the liveness decides on that stale
clock and keeps the run cached, and the real workflow task then sends those decisions. A
replay with the recorded clock decides otherwise: a nondeterminism error on every attempt.

Dev server, real Postgres, short timings. W1 is ``python worker.py``, SIGKILLed as the
campaign kills its replicas: the liveness stays bound to W1's sticky queue, so the workflow
task that the timer or the beat schedules waits there (``REAPER_STICKY_TIMEOUT``) while W2
takes the query from the normal queue. (A controller that stops cleanly unbinds its sticky
queue; W2 then takes that workflow task or the query first, as the server's matching
happens to pick, and the race is no longer reproducible at will.) W2 is an in-process
controller, the code under test. ``race`` says what lands between the query and W2's
start: the deadline timer firing, one beat, or both.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError

from reaper.core.contract import StateView
from tests.support.controller import ControllerProcess, controller, make_settings
from tests.support.heartbeats import beat, failed_tasks, send
from tests.support.polling import eventually
from workflows import WorkerLiveness
from workflows.common import collector_id, fleet_monitor_id, liveness_id
from workflows.replay import replay_check

TIMINGS = dict(
    heartbeat_interval=1,
    stall_after=3,
    lost_after=6,
    missing_ttl=3,
    resync_interval=1,
    full_resync_interval=1,
    disruption_threshold=1.0,
)
ENV = {f"REAPER_{k.upper()}": str(v) for k, v in TIMINGS.items()}
E = EventType


async def events_of(client: Client, workflow_id: str) -> list[HistoryEvent]:
    return list((await client.get_workflow_handle(workflow_id).fetch_history()).events)


async def task_pending(client: Client, workflow_id: str) -> bool:
    desc = await client.get_workflow_handle(workflow_id).describe()
    return desc.raw_description.HasField("pending_workflow_task")


def times_fired(events: list[HistoryEvent]) -> int:
    return sum(e.event_type == E.EVENT_TYPE_TIMER_FIRED for e in events)


async def last_seq(client: Client, worker: str) -> int:
    """The liveness's ``last_seq``, or -1 when the query failed (a stuck liveness)."""
    try:
        st = await client.get_workflow_handle(liveness_id(worker)).query(
            WorkerLiveness.state, result_type=StateView, rpc_timeout=timedelta(seconds=2)
        )
    except (RPCError, WorkflowQueryFailedError):
        return -1
    return st.last_seq if st.last_seq is not None else -1


def pending_timer_due(events: list[HistoryEvent]) -> float | None:
    """When the run's running timer fires (epoch seconds), if one runs."""
    started = {e.event_id: e for e in events if e.event_type == E.EVENT_TYPE_TIMER_STARTED}
    for e in events:
        if e.event_type == E.EVENT_TYPE_TIMER_FIRED:
            started.pop(e.timer_fired_event_attributes.started_event_id, None)
        elif e.event_type == E.EVENT_TYPE_TIMER_CANCELED:
            started.pop(e.timer_canceled_event_attributes.started_event_id, None)
    if not started:
        return None
    e = max(started.values(), key=lambda e: e.event_id)
    timeout = e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
    return e.event_time.ToDatetime().timestamp() + timeout.total_seconds()


async def replay_failures(client: Client, workflow_id: str, keep: Path) -> list[str]:
    """Why each run of the workflow fails to replay on this code, if it does; the history of
    each run that fails is kept in ``keep`` (its path is in the message)."""
    replay, found = replay_check(), []
    async for wf in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        history = await client.get_workflow_handle(workflow_id, run_id=wf.run_id).fetch_history()
        failure = await replay(history)
        if failure is not None:
            kept = keep / f"{workflow_id}-{wf.run_id}.json"
            kept.write_text(history.to_json())
            found.append(f"replay of run {wf.run_id} (history in {kept}): {failure}")
    return found


class Agent:
    """One agent, beating when told; ``handled`` waits until its last beat was handled."""

    def __init__(self, client: Client, task_queue: str, worker: str) -> None:
        self.client, self.tq, self.worker = client, task_queue, worker
        self.seq = 0
        self.last_sent = 0.0

    async def beat(self) -> None:
        self.seq += 1
        self.last_sent = time.time()
        await send(self.client, self.tq, beat(self.worker, self.seq))

    async def handled(self, timeout: float = 20.0) -> None:
        want = self.seq
        await eventually(
            lambda: last_seq(self.client, self.worker),
            lambda s: s >= want,
            timeout=timeout,
            poll=0.1,
            what=f"beat {want} of {self.worker} handled",
        )


async def beat_until_time_to_spare(agent: Agent, workflow_id: str, spare: float) -> None:
    """Beat about every second until, right after a beat, no workflow task is pending and
    the running timer fires at least ``spare`` seconds later (it was armed by that beat)."""
    client = agent.client
    for _ in range(40):
        await agent.beat()
        await agent.handled()
        await eventually(
            lambda: task_pending(client, workflow_id), lambda p: not p, what="no task pending"
        )
        due = pending_timer_due(await events_of(client, workflow_id))
        if due is not None and due - time.time() >= spare:
            return
        await asyncio.sleep(0.7)
    raise AssertionError("no beat left the timer far enough away")


@pytest.mark.parametrize("race", ["timer", "beat", "timer+beat"])
async def test_a_query_racing_a_timer_or_a_beat_leaves_the_liveness_working(
    dev_env, pool, db_url, tmp_path, race: str
) -> None:
    client = dev_env.client
    address = client.service_client.config.target_host
    w1 = ControllerProcess(address, db_url, tmp_path / "w1.log", ENV)
    tq = w1.task_queue
    worker = f"qrace-{uuid.uuid4().hex[:6]}"
    wid = liveness_id(worker)
    settings = make_settings(**TIMINGS)
    agent = Agent(client, tq, worker)
    try:
        w1.start()
        await agent.beat()
        await agent.handled(timeout=60)  # waits for W1 to start
        # With a beat only, the timer must not fire before W2 takes the query.
        await beat_until_time_to_spare(agent, wid, spare=2.4 if race == "beat" else 1.5)
        w1.kill()
        before = await events_of(client, wid)
        assert not await task_pending(client, wid), "a workflow task is pending: no race"
        assert (pending_timer_due(before) or 0) > time.time(), "the timer fired: no race"
        last_beat = agent.last_sent

        # No workflow task is pending: the query goes to a worker as a legacy query task and
        # waits for one to poll. There is none until W2.
        query = asyncio.create_task(
            client.get_workflow_handle(wid).query(
                WorkerLiveness.state, result_type=StateView, rpc_timeout=timedelta(seconds=30)
            )
        )
        await asyncio.sleep(0.1)
        if "timer" in race:
            await eventually(
                lambda: events_of(client, wid),
                lambda evs: pending_timer_due(evs) is None,
                timeout=10,
                poll=0.1,
                what="the deadline timer fired",
            )
            # W2's real task then starts after the stall deadline (the stale clock does not).
            await asyncio.sleep(max(0.0, last_beat + TIMINGS["stall_after"] + 0.5 - time.time()))
        if "beat" in race:
            await agent.beat()
        await asyncio.sleep(0.1)
        between = [e for e in await events_of(client, wid) if e.event_id > before[-1].event_id]
        print(
            f"\n[{race}] events while no worker ran: "
            + ", ".join(E.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in between)
        )
        assert not any(e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_STARTED for e in between)

        async with controller(client, pool, settings, tq):  # W2
            try:
                answer: StateView | BaseException = await asyncio.wait_for(query, 35)
            except Exception as exc:  # shown, then judged below
                answer = exc
            print(f"[{race}] the racing query answered: {answer!r}"[:400])
            if isinstance(answer, StateView) and answer.last_heartbeat_at is not None:
                late = answer.last_heartbeat_at.timestamp() - agent.last_sent
                print(f"[{race}] its last_heartbeat_at minus the last beat's send: {late:+.3f}s")
            try:
                for _ in range(4):
                    await agent.beat()
                    await agent.handled()
                    await asyncio.sleep(1.0)
            except AssertionError as exc:
                print(f"[{race}] {exc}"[:200])
            failures = await failed_tasks(client, wid)
            # W2 keeps the run cached and never replays it: replay every run as any other
            # controller (or W2 after an eviction) would.
            failures += await replay_failures(client, wid, tmp_path)
            for f in failures[:2]:
                print(f"[{race}] {f[:400]}")
            assert failures == [], f"{len(failures)} failed workflow tasks or replays"
    finally:
        w1.stop()
        for w in (wid, collector_id(worker), fleet_monitor_id(tq)):
            try:
                await client.get_workflow_handle(w).terminate("test over")
            except RPCError:
                pass
