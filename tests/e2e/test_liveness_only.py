"""Liveness-only reports made visible (issue 35, item 2): a worker whose beats keep coming
without complete reports is named by ``reaper workers`` (a column, and ``liveness_only`` in
``--json``), by ``reaper explain worker`` ("reports liveness only since ...") and by the
gauge ``reaper_workers_reports_incomplete``, against a real controller, dev server and
Postgres; and it is no longer named once its complete reports resume."""

from __future__ import annotations

import json
import uuid
from datetime import datetime

import asyncpg
from temporalio.testing import WorkflowEnvironment

from reaper.infra.metrics_endpoint import read_fleet
from tests.support.agents import Agents
from tests.support.cli import run_cli
from tests.support.controller import controller, make_settings
from tests.support.polling import eventually

TIMINGS = dict(
    heartbeat_interval=1, stall_after=3, lost_after=60, missing_ttl=30, resync_interval=2
)
FULL = {"containers": [], "volumes": [], "tasks": []}


def env_of(dev_env: WorkflowEnvironment, db_url: str, tq: str) -> dict[str, str]:
    return {
        "REAPER_TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
        "REAPER_DATABASE_URL": db_url,
        "REAPER_TASK_QUEUE": tq,
        "COLUMNS": "120",
        **{f"REAPER_{k.upper()}": str(v) for k, v in TIMINGS.items()},
    }


async def workers_json(env: dict[str, str]) -> dict[str, dict]:
    out = await run_cli("workers", "--json", env=env)
    assert out.returncode == 0, out.stderr
    return {w["worker"]: w for w in json.loads(out.stdout)["workers"]}


async def test_a_worker_beating_without_complete_reports_is_named(
    dev_env: WorkflowEnvironment, pool: asyncpg.Pool, db_url: str
) -> None:
    client, tq = dev_env.client, f"tq-lo-{uuid.uuid4().hex[:8]}"
    sfx = uuid.uuid4().hex[:6]
    ok, blind = f"ok-{sfx}", f"blind-{sfx}"
    env = env_of(dev_env, db_url, tq)
    resync = float(TIMINGS["resync_interval"])
    async with controller(client, pool, make_settings(**TIMINGS), tq):
        with Agents(client, tq) as agents:
            agents.reports = {ok: FULL, blind: FULL}
            both = await eventually(
                lambda: workers_json(env),
                lambda ws: all(
                    ws.get(w, {}).get("complete_reports") and not ws[w]["liveness_only"]
                    for w in (ok, blind)
                ),
                timeout=60,
                poll=0.5,
                what="both workers with complete reports",
            )
            last_complete = max(
                datetime.fromisoformat(t) for t in both[blind]["complete_reports"].values()
            )

            # The engine of blind's host stops answering: its agent beats liveness only.
            agents.reports[blind] = {}
            ws = await eventually(
                lambda: workers_json(env),
                lambda ws: ws.get(blind, {}).get("liveness_only") is not None,
                timeout=60,
                poll=0.5,
                what=f"{blind} named liveness only",
            )
            verdict = ws[blind]["liveness_only"]
            assert verdict["kinds"] == ["containers", "volumes", "tasks"]
            since = datetime.fromisoformat(verdict["since"])
            assert since >= last_complete and ws[ok]["liveness_only"] is None
            assert ws[blind]["state"] == "running" and ws[blind]["missing"] == 0

            # Wide enough that no cell wraps: the table lists every worker of this process's
            # database, and another test's long "query failed" cell narrows the state column.
            table = await run_cli("workers", env={**env, "COLUMNS": "240"})
            assert table.returncode == 0, table.stderr
            [row] = [ln for ln in table.stdout.splitlines() if blind in ln]
            assert "liveness only" in row, table.stdout
            [row] = [ln for ln in table.stdout.splitlines() if ok in ln]
            assert "liveness only" not in row and "ago" in row, table.stdout

            out = await run_cli("explain", "worker", blind, "--json", env=env)
            assert out.returncode == 0, out.stderr
            notes = json.loads(out.stdout)["notes"]
            [note] = [n for n in notes if "liveness only" in n]
            assert note.startswith(
                f"reports liveness only since {since:%Y-%m-%d %H:%M:%S} UTC"
                " (containers, volumes, tasks)"
            ), note
            out = await run_cli("explain", "worker", ok, "--json", env=env)
            assert not [n for n in json.loads(out.stdout)["notes"] if "liveness only" in n]

            gauges = await read_fleet(pool, 0.55, resync)
            assert gauges.reports_incomplete == 1 and gauges.workers["running"] == 2

            # Complete reports again: no longer named, the gauge back to 0.
            agents.reports[blind] = FULL
            await eventually(
                lambda: workers_json(env),
                lambda ws: "state" in ws.get(blind, {}) and ws[blind]["liveness_only"] is None,
                timeout=60,
                poll=0.5,
                what=f"{blind}'s complete reports resumed",
            )
            await eventually(
                lambda: read_fleet(pool, 0.55, resync),
                lambda g: g.reports_incomplete == 0,
                timeout=30,
                what="the gauge back to 0",
            )
