"""Rotating a host from the command line (CONTRACT.md §6.3): ``reaper drain W --migrate
--wait`` against a real dev server, controller (with its fleet monitor), Postgres and
reference agents (directory runtime: they start what is placed on them and remove their
orphans). The command shows each task's migration and exits 0 once W is drained; a refused
command prints why, exits 1 and leaves no event in the liveness's history.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path

import asyncpg
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from reaper.cli.agent import Agent
from reaper.core.models import Timings
from tests.support.cli import run_cli
from tests.support.controller import controller, make_settings
from tests.support.heartbeats import query_state
from tests.support.polling import eventually
from tests.support.releases import HISTORIES
from tests.support.upgrade import histories_where, sequence
from workflows.common import fleet_monitor_id, liveness_id
from workflows.fleet import FleetMonitor

TIMINGS = dict(heartbeat_interval=1.0, stall_after=4, lost_after=60, missing_ttl=5)


def task_files(state_dir: Path) -> list[str]:
    """The task files a directory-runtime agent holds."""
    return sorted(p.name for p in (state_dir / "tasks").iterdir())


def agent(
    tmp_path: Path,
    client: Client,
    tq: str,
    worker: str,
    interval: float = TIMINGS["heartbeat_interval"],
) -> Agent:
    async def same_client() -> Client:
        return client

    return Agent(
        worker=worker,
        state_dir=tmp_path / worker,
        task_queue=tq,
        interval=interval,
        client_factory=same_client,
    )


async def update_events(client: Client, worker: str) -> list[str]:
    """The update events of every run of ``worker``'s liveness."""
    runs = await histories_where(client, f"WorkflowId = '{liveness_id(worker)}'")
    return [e for h in runs for e in sequence(h) if "UPDATE" in e]


async def test_drain_migrate_wait_moves_every_task_and_exits_when_drained(
    dev_env: WorkflowEnvironment, pool: asyncpg.Pool, db_url: str, tmp_path: Path
) -> None:
    client, tq = dev_env.client, f"tq-rot-{uuid.uuid4().hex[:8]}"
    suffix = uuid.uuid4().hex[:6]
    w, x = f"w-{suffix}", f"x-{suffix}"
    service = f"web-{suffix}"
    ids = [f"{service}-{i}" for i in (1, 2, 3)]
    await pool.execute("INSERT INTO reaper.services (name, desired_count) VALUES ($1, 3)", service)
    for t in ids:
        await pool.execute(
            "INSERT INTO reaper.tasks (id, service, worker, state) VALUES ($1, $2, $3, 'pending')",
            t,
            service,
            w,
        )
    settings = make_settings(**TIMINGS)
    env = {"REAPER_TEMPORAL_ADDRESS": client.service_client.config.target_host}
    stop = asyncio.Event()
    async with controller(client, pool, settings, tq):
        await client.start_workflow(
            FleetMonitor.run, Timings.of(settings), id=fleet_monitor_id(tq), task_queue=tq
        )
        agents = [asyncio.create_task(agent(tmp_path, client, tq, n).run(stop)) for n in (w, x)]
        try:
            await eventually(
                lambda: pool.fetchval(
                    "SELECT count(*) FROM reaper.tasks WHERE worker = $1 AND state = 'running'", w
                ),
                lambda n: n == 3,
                timeout=30,
                what="w's tasks running",
            )
            # A bad deadline: refused, nothing changed, no update event in any run's history
            # (beats go on adding theirs, and the dev server here continues-as-new often).
            bad = await run_cli(
                "drain", w, "--reason", "rotate", "--migrate", "--deadline", "1s", env=env
            )
            assert bad.returncode == 1, bad.stdout + bad.stderr
            assert "below 2 x HEARTBEAT_INTERVAL" in bad.stderr, bad.stderr
            assert await update_events(client, w) == []
            assert not await pool.fetchval("SELECT draining FROM reaper.workers WHERE name=$1", w)

            out = await run_cli(
                "drain",
                w,
                "--reason",
                "rotate",
                "--migrate",
                "--deadline",
                "10m",
                "--wait",
                "--database-url",
                db_url,
                env=env,
            )
            assert out.returncode == 0, out.stdout + out.stderr
            print(out.stdout)  # the timeline, with -s
            # Its agent removed the stopped originals (orphans, rule 7) before the command
            # said drained: it waits for w's reports to hold no task.
            assert task_files(tmp_path / w) == []
            lines = out.stdout.splitlines()
            assert lines[0].startswith(f"drain of {w}: changed; draining; migrating until"), lines
            for t in ids:
                steps = [ln.split(f"{t}: ", 1)[1] for ln in lines if f"  {t}: " in ln]
                assert [s.split()[1] if s.startswith("replacement") else s for s in steps] == [
                    steps[0].split()[1],
                    steps[1].split()[1],
                    "stopped (drained)",
                ], steps
                assert steps[0].startswith("replacement") and "placed on " + x in steps[0]
                assert steps[1].startswith("replacement") and "running on " + x in steps[1]
            assert lines[-1].endswith(f"{w}: drained"), lines
            assert len(await update_events(client, w)) == 2  # the accepted one: accepted, completed
            said = await run_cli(
                "explain", "worker", w, "--json", "--database-url", db_url, env=env
            )
            assert said.returncode == 0, said.stderr
            assert any(n.startswith("drained since") for n in json.loads(said.stdout)["notes"])
            listing = await run_cli("workers", "--database-url", db_url, env=env)
            assert "(drained)" in listing.stdout, listing.stdout
            await eventually(
                lambda: query_state(client, w), lambda s: s.drained, timeout=20, what="drained"
            )
        finally:
            stop.set()
            await asyncio.gather(*agents, return_exceptions=True)
            await client.get_workflow_handle(fleet_monitor_id(tq)).terminate("test over")


async def test_a_migration_steps_on_its_reports_not_on_the_monitors_tick(
    dev_env: WorkflowEnvironment, pool: asyncpg.Pool, db_url: str, tmp_path: Path
) -> None:
    """The controller's heartbeat interval, and so the fleet monitor's tick, is a minute
    here while the agents beat every second, so every step after the monitor's first check
    comes from a wake (``activities.changes.wake_upkeep``): the drain wakes it to place the
    first wave, each replacement reported running wakes it to stop its original and place
    the next (max_surge 1: two waves), and the last stop drains the worker, all well inside
    the minute (no timer of the monitor fires). Without the wakes nothing moves before the
    tick."""
    client, tq = dev_env.client, f"tq-wake-{uuid.uuid4().hex[:8]}"
    suffix = uuid.uuid4().hex[:6]
    w, x, service = f"w-{suffix}", f"x-{suffix}", f"api-{suffix}"
    await pool.execute("INSERT INTO reaper.services (name, desired_count) VALUES ($1, 2)", service)
    for t in (f"{service}-1", f"{service}-2"):
        await pool.execute(
            "INSERT INTO reaper.tasks (id, service, worker, state) VALUES ($1, $2, $3, 'pending')",
            t,
            service,
            w,
        )
    settings = make_settings(
        heartbeat_interval=60.0,
        stall_after=120,
        lost_after=300,
        missing_ttl=180,
        resync_interval=60,
    )
    env = {"REAPER_TEMPORAL_ADDRESS": client.service_client.config.target_host}
    stop = asyncio.Event()
    async with controller(client, pool, settings, tq):
        await client.start_workflow(
            FleetMonitor.run, Timings.of(settings), id=fleet_monitor_id(tq), task_queue=tq
        )
        agents = [
            asyncio.create_task(agent(tmp_path, client, tq, n, interval=1.0).run(stop))
            for n in (w, x)
        ]
        try:
            await eventually(  # w's agent runs both; x is placeable, as Postgres says
                lambda: pool.fetch(
                    "SELECT w.name, w.state, count(t.id) FILTER (WHERE t.state = 'running')"
                    " FROM reaper.workers w LEFT JOIN reaper.tasks t ON t.worker = w.name"
                    " WHERE w.name = ANY($1::text[]) GROUP BY w.name ORDER BY w.name",
                    [w, x],
                ),
                lambda rows: [tuple(r) for r in rows] == [(w, "running", 2), (x, "running", 0)],
                timeout=30,
                what="w running both tasks, x running",
            )
            out = await run_cli(
                "drain", w, "--reason", "rotate", "--migrate", "--deadline", "10m", env=env
            )
            assert out.returncode == 0, out.stdout + out.stderr
            drained_at = await eventually(
                lambda: pool.fetchval("SELECT drained_at FROM reaper.workers WHERE name=$1", w),
                lambda at: at is not None,
                timeout=40,  # inside the monitor's first tick: a minute after its start
                what="w drained by wakes alone",
            )
            rows = await pool.fetch(
                "SELECT worker, state, stop_reason FROM reaper.tasks WHERE service = $1"
                " ORDER BY created_at, id",
                service,
            )
            assert [tuple(r) for r in rows] == [
                (w, "stopped", "drained"),
                (w, "stopped", "drained"),
                (x, "running", None),
                (x, "running", None),
            ], rows
            runs = await histories_where(
                client, f"WorkflowId = '{fleet_monitor_id(tq)}'"
            )  # it continues as new often
            fired = [e for h in runs for e in sequence(h) if e.startswith("TIMER_FIRED")]
            assert fired == [], (fired, drained_at)  # no tick came: the wakes did it all
            woken = [sequence(h).count("WORKFLOW_EXECUTION_SIGNALED:upkeep") for h in runs]
            assert sum(woken) >= 3, woken  # the drain, and each wave's replacement running
            if os.environ.get("REAPER_RECORD_HISTORIES") == "1":  # tests/workflows/test_replay
                richest = runs[woken.index(max(woken))]
                (HISTORIES / "fleet-woken.json").write_text(richest.to_json())
        finally:
            stop.set()
            await asyncio.gather(*agents, return_exceptions=True)
            await client.get_workflow_handle(fleet_monitor_id(tq)).terminate("test over")
