"""Rotating a host from the command line (CONTRACT.md §6.3): ``reaper drain W --migrate
--wait`` against a real dev server, controller (with its fleet monitor), Postgres and
reference agents (directory runtime: they start what is placed on them and remove their
orphans). The command shows each task's migration and exits 0 once W is drained; a refused
command prints why, exits 1 and leaves no event in the liveness's history.
"""

from __future__ import annotations

import asyncio
import json
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
from tests.support.upgrade import sequence
from workflows.common import fleet_monitor_id, liveness_id
from workflows.fleet import FleetMonitor

TIMINGS = dict(heartbeat_interval=1.0, stall_after=4, lost_after=60, missing_ttl=5)


def task_files(state_dir: Path) -> list[str]:
    """The task files a directory-runtime agent holds."""
    return sorted(p.name for p in (state_dir / "tasks").iterdir())


def agent(tmp_path: Path, client: Client, tq: str, worker: str) -> Agent:
    async def same_client() -> Client:
        return client

    return Agent(
        worker=worker,
        state_dir=tmp_path / worker,
        task_queue=tq,
        interval=TIMINGS["heartbeat_interval"],
        client_factory=same_client,
    )


async def update_events(client: Client, worker: str) -> list[str]:
    """The update events of every run of ``worker``'s liveness."""
    found = []
    async for run in client.list_workflows(f"WorkflowId = '{liveness_id(worker)}'"):
        handle = client.get_workflow_handle(liveness_id(worker), run_id=run.run_id)
        found += [e for e in sequence(await handle.fetch_history()) if "UPDATE" in e]
    return found


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
