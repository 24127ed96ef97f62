"""The ``reaper`` command line, run as a real process against a real dev server and Postgres."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, cast
from urllib.request import urlopen

import asyncpg
import psutil
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from reaper.cli.agent import Agent
from reaper.cli.agent_retire import RETIRE_ON_STOP_REASON
from reaper.core.contract import RETIRE_SIGNAL, StateView
from reaper.kit.processes import Child, free_port, is_listening
from tests.support.cli import reaper, run_cli, start_run
from tests.support.controller import controller, make_settings
from tests.support.heartbeats import query_state
from tests.support.polling import eventually

FAST = dict(
    heartbeat_interval=0.2, stall_after=5, lost_after=30, missing_ttl=5, resync_interval=0.4
)


def address(env: WorkflowEnvironment) -> str:
    return env.client.service_client.config.target_host


async def test_force_reap_of_an_unknown_worker_is_refused(dev_env: WorkflowEnvironment) -> None:
    name = f"nobody-{uuid.uuid4().hex[:6]}"
    out = await run_cli("force-reap", name, "--reason", "test", "--address", address(dev_env))
    assert out.returncode == 1, out
    assert f"unknown worker '{name}'" in out.stderr
    assert f"liveness-{name}" in out.stderr


async def test_drain_of_an_unknown_worker_is_refused(dev_env: WorkflowEnvironment) -> None:
    out = await run_cli("drain", "ghost", "--reason", "test", "--address", address(dev_env))
    assert out.returncode == 1 and "unknown worker 'ghost'" in out.stderr, out


@pytest.mark.parametrize("command", ["retire", "undrain"])
async def test_retire_and_undrain_of_an_unknown_worker_are_refused(
    dev_env: WorkflowEnvironment, command: str
) -> None:
    name = f"nobody-{uuid.uuid4().hex[:6]}"
    out = await run_cli(command, name, "--reason", "test", "--address", address(dev_env))
    assert out.returncode == 1, out
    assert out.stderr.strip().count("\n") == 0, out.stderr  # one line
    assert f"unknown worker '{name}'" in out.stderr and f"liveness-{name}" in out.stderr
    assert out.stdout == ""


def test_bad_configuration_names_the_variable() -> None:
    out = reaper("run", "--heartbeat-interval", "10s", "--stall-after", "15s")
    assert out.returncode == 2, out
    assert "--stall-after must be at least 2 * --heartbeat-interval" in out.stderr, out
    out = reaper("agent", "--worker", "w 1", "--state-dir", "/tmp/x")
    assert out.returncode == 1 and "--worker" in out.stderr, out


async def test_workers_drain_and_force_reap_of_a_running_worker(
    dev_env: WorkflowEnvironment, pool: asyncpg.Pool, db_url: str, tmp_path: Path
) -> None:
    client, tq = dev_env.client, f"tq-{uuid.uuid4().hex[:8]}"

    async def same_client() -> Client:
        return client

    agent = Agent(
        worker=f"cli-{uuid.uuid4().hex[:6]}",
        state_dir=tmp_path,
        task_queue=tq,
        interval=FAST["heartbeat_interval"],
        client_factory=same_client,
    )
    w = agent.worker
    (tmp_path / "tasks" / "t-1").touch()
    await pool.execute(
        "INSERT INTO reaper.tasks (id, worker, state) VALUES ('t-1', $1, 'pending')", w
    )
    stop = asyncio.Event()
    async with controller(client, pool, make_settings(**FAST), tq):
        runner = asyncio.create_task(agent.run(stop))
        try:
            await eventually(
                lambda: pool.fetchval("SELECT state FROM reaper.tasks WHERE id = 't-1'"),
                lambda st: st == "running",
                what="t-1 running",
            )
            env = {"REAPER_DATABASE_URL": db_url}

            async def listing() -> dict[str, Any]:
                out = await run_cli("workers", "--json", "--address", address(dev_env), env=env)
                assert out.returncode == 0, out
                return cast(dict[str, Any], json.loads(out.stdout))

            # A row whose query found the liveness busy for 5 s says so ({"worker", "error"},
            # as on a loaded clean clone's run); an operator asks again, and so does this.
            data = await eventually(
                listing,
                lambda d: [("error" in r) for r in d["workers"] if r["worker"] == w] == [False],
                timeout=60,
                what="a listing in which the worker answered",
            )
            mine = [row for row in data["workers"] if row["worker"] == w]
            assert len(mine) == 1, data
            assert mine[0]["state"] == "running" and mine[0]["running_tasks"] == 1
            assert mine[0]["boot_id"] == agent.boot_id
            assert data["fleet"]["state"] in ("normal", "partial", "full")

            out = await run_cli("workers", "--address", address(dev_env), env=env)
            assert out.returncode == 0 and w in out.stdout and "fleet:" in out.stdout, out

            out = await run_cli(
                "drain", w, "--reason", "kernel upgrade", "--address", address(dev_env)
            )
            assert out.returncode == 0, out
            await eventually(
                lambda: query_state(client, w), lambda v: v.draining, what="worker draining"
            )

            out = await run_cli(
                "force-reap",
                w,
                "--reason",
                "disk failed",
                "--address",
                address(dev_env),
                env={"USER": "alice"},
            )
            assert out.returncode == 0, out
            await eventually(
                lambda: pool.fetchval("SELECT state FROM reaper.tasks WHERE id = 't-1'"),
                lambda st: st == "lost",
                what="t-1 lost after force-reap",
            )
            row = await pool.fetchrow(
                "SELECT reason, actor FROM reaper.events WHERE handle = 't-1' AND action = 'lost'"
            )
            assert row["reason"] == "disk failed" and row["actor"] == "alice"
        finally:
            stop.set()
            await asyncio.wait_for(runner, timeout=10)


def _in_process_agent(tmp_path: Path, client: Client, tq: str) -> Agent:
    async def same_client() -> Client:
        return client

    return Agent(
        worker=f"cli-{uuid.uuid4().hex[:6]}",
        state_dir=tmp_path,
        task_queue=tq,
        interval=FAST["heartbeat_interval"],
        client_factory=same_client,
    )


def _rows_of(out: subprocess.CompletedProcess[str], worker: str) -> list[dict[str, object]]:
    assert out.returncode == 0, out
    return [row for row in json.loads(out.stdout)["workers"] if row["worker"] == worker]


async def test_undrain_then_retire_of_a_running_worker(
    dev_env: WorkflowEnvironment, pool: asyncpg.Pool, db_url: str, tmp_path: Path
) -> None:
    client, tq = dev_env.client, f"tq-{uuid.uuid4().hex[:8]}"
    agent = _in_process_agent(tmp_path, client, tq)
    w, addr = agent.worker, address(dev_env)
    (tmp_path / "tasks" / "t-1").touch()
    await pool.execute(
        "INSERT INTO reaper.tasks (id, worker, state) VALUES ('t-1', $1, 'pending')", w
    )
    stop = asyncio.Event()
    async with controller(client, pool, make_settings(**FAST), tq):
        runner = asyncio.create_task(agent.run(stop))
        try:
            await eventually(
                lambda: pool.fetchval("SELECT state FROM reaper.tasks WHERE id = 't-1'"),
                lambda st: st == "running",
                what="t-1 running",
            )
            out = await run_cli("drain", w, "--reason", "maintenance", "--address", addr)
            assert out.returncode == 0, out
            await eventually(
                lambda: query_state(client, w), lambda v: v.draining, what="worker draining"
            )
            out = await run_cli(
                "undrain", w, "--reason", "done", "--address", addr, env={"USER": "bob"}
            )
            assert out.returncode == 0, out
            assert out.stdout.startswith(f"undrain of {w}: changed; not draining"), out.stdout
            assert "actor: bob" in out.stdout
            # The liveness shows the change once its activity has written workers.draining.
            await eventually(
                lambda: query_state(client, w), lambda v: not v.draining, what="undrained"
            )
            draining = await pool.fetchval("SELECT draining FROM reaper.workers WHERE name = $1", w)
            assert draining is False
            undrain = await pool.fetchrow(
                "SELECT reason, actor FROM reaper.events WHERE worker = $1 AND action = 'undrain'",
                w,
            )
            assert undrain is not None and (undrain["reason"], undrain["actor"]) == ("done", "bob")

            out = await run_cli(
                "retire", w, "--reason", "scale-in", "--address", addr, env={"USER": "alice"}
            )
            assert out.returncode == 0, out
            assert out.stdout.startswith(f"retire of {w}: changed; running -> retired"), out
            await eventually(
                lambda: pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", w),
                lambda st: st == "retired",
                what="workers row retired",
            )
            row = await pool.fetchrow(
                "SELECT state, stop_reason FROM reaper.tasks WHERE id = 't-1'"
            )
            assert (row["state"], row["stop_reason"]) == ("lost", "worker-retired")
            event = await pool.fetchrow(
                "SELECT reason, actor FROM reaper.events"
                " WHERE worker = $1 AND kind = 'worker' AND action = 'state'"
                " AND reason LIKE '%-> retired%'",
                w,
            )
            assert event is not None and "scale-in" in event["reason"]
            assert event["actor"] == "alice"
        finally:
            stop.set()
            await asyncio.wait_for(runner, timeout=10)
        # Stopped: no beat of the retired boot starts a liveness run while we list.
        await eventually(
            lambda: client.get_workflow_handle(f"liveness-{w}").describe(),
            lambda d: d.status is not WorkflowExecutionStatus.RUNNING,
            what="liveness completed",
        )
        env = {"REAPER_DATABASE_URL": db_url}
        assert _rows_of(await run_cli("workers", "--json", "--address", addr, env=env), w) == []
        out = await run_cli("workers", "--json", "--all", "--address", addr, env=env)
        [mine] = _rows_of(out, w)
        assert mine["state"] == "retired" and mine["running_tasks"] == 0, mine
        assert mine["boot_id"] == agent.boot_id
        out = await run_cli("workers", "--address", addr, env=env)
        assert out.returncode == 0 and w not in out.stdout, out
        out = await run_cli("workers", "--all", "--address", addr, env=env)
        assert out.returncode == 0, out
        [line] = [ln for ln in out.stdout.splitlines() if w in ln]
        assert "retired" in line, out.stdout
        out = await run_cli("retire", w, "--reason", "again", "--address", addr)
        assert out.returncode == 1 and f"unknown worker '{w}'" in out.stderr, out


async def _state_or_none(client: Client, worker: str) -> StateView | None:
    """The ``state`` query, or ``None`` before the agent's first beat started the liveness."""
    try:
        return await query_state(client, worker)
    except RPCError:
        return None


async def _signals(client: Client, worker: str) -> list[str]:
    """Names of the signals in every run of ``liveness-{worker}``."""
    names = []
    async for run in client.list_workflows(f"WorkflowId = 'liveness-{worker}'"):
        handle = client.get_workflow_handle(f"liveness-{worker}", run_id=run.run_id)
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                names.append(event.workflow_execution_signaled_event_attributes.signal_name)
    return names


async def test_agent_retires_on_stop_only_with_the_flag(
    dev_env: WorkflowEnvironment, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    client, tq = dev_env.client, f"tq-{uuid.uuid4().hex[:8]}"
    timings = dict(FAST, stall_after=1)
    suffix = uuid.uuid4().hex[:6]
    leaving, restarting = f"leaving-{suffix}", f"restarting-{suffix}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REAPER_")}
    agents: dict[str, Child] = {}
    for name, flags in ((leaving, ["--retire-on-stop"]), (restarting, [])):
        argv = ["agent", "--worker", name, "--state-dir", str(tmp_path / name)]
        argv += ["--address", address(dev_env), "--task-queue", tq]
        child = Child(
            f"agent {name}",
            [sys.executable, "-m", "reaper.cli", *argv, "--heartbeat-interval", "0.2", *flags],
            env,
            log_path=tmp_path / f"{name}.log",
            restart=False,
            cwd=Path(__file__).parent,  # no .env of the caller
        )
        child.start()
        agents[name] = child
    try:
        async with controller(client, pool, make_settings(**timings), tq):
            for name in agents:
                await eventually(
                    lambda name=name: _state_or_none(client, name),
                    lambda v: v is not None and v.state == "running" and v.last_seq is not None,
                    timeout=30,
                    what=f"{name} running",
                )
            for child in agents.values():
                child.signal(signal.SIGTERM)
            for name, child in agents.items():
                assert child.proc is not None
                code = await asyncio.to_thread(child.proc.wait, 15)
                assert code == 0, (tmp_path / f"{name}.log").read_text()

            # With the flag: the retire was sent before the agent exited, and it is done.
            await eventually(
                lambda: pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", leaving),
                lambda st: st == "retired",
                what=f"{leaving} retired",
            )
            reason = await pool.fetchval(
                "SELECT reason FROM reaper.events WHERE worker = $1 AND kind = 'worker'"
                " AND action = 'state' AND reason LIKE '%-> retired%'",
                leaving,
            )
            assert RETIRE_ON_STOP_REASON in reason
            assert "sent retire" in (tmp_path / f"{leaving}.log").read_text()

            # Without it: a stop is a restart. The liveness keeps judging the silent worker
            # (stalled), and no retire was ever sent (the agent has exited: none can come).
            await eventually(
                lambda: query_state(client, restarting),
                lambda v: v.state == "stalled",
                what=f"{restarting} stalled",
            )
            assert RETIRE_SIGNAL not in await _signals(client, restarting)
            state = await pool.fetchval(
                "SELECT state FROM reaper.workers WHERE name = $1", restarting
            )
            assert state in ("running", "stalled"), state
            status = (await client.get_workflow_handle(f"liveness-{restarting}").describe()).status
            assert status is WorkflowExecutionStatus.RUNNING
    finally:
        for child in agents.values():
            child.stop()


@pytest.mark.e2e
def test_run_serves_the_web_ui_and_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    port, ui = free_port(), free_port()
    proc, log = start_run(
        tmp_path,
        "--heartbeat-interval",
        "1s",
        REAPER_TEMPORAL_ADDRESS=f"127.0.0.1:{port}",
        REAPER_UI_PORT=str(ui),
        REAPER_STATE_DIR=str(tmp_path / "state"),
    )
    try:
        deadline = time.monotonic() + 60
        while "serving task queue" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        text = log.read_text()
        assert f"http://localhost:{ui}" in text and str(tmp_path / "state") in text
        # The banner's timings at 80 columns (its output is not a terminal: rich's 80), the
        # defaults' widest values, each phrase whole on its line (issue 35).
        lines = [ln.rstrip() for ln in text.splitlines()]
        assert any(
            ln.startswith("Timings ") and ln.endswith("stalled after 30s, lost after 300s")
            for ln in lines
        ), text
        assert "…" not in text, text  # long paths fold, never cut short
        assert any(ln.strip() == "missing TTL 300s, resync 30s" for ln in lines), text
        with urlopen(f"http://127.0.0.1:{ui}/", timeout=10) as resp:
            assert resp.status == 200
        children = [int(p) for p in re.findall(r"\(pid (\d+)\)", text)]
        assert len(children) == 2, text  # the dev server and the controller
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, log.read_text()
        assert "stopped" in log.read_text()
        assert not is_listening("127.0.0.1", port)
        for pid in children:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
        pgdata = tmp_path / "state" / "postgres"
        assert not (pgdata / "postmaster.pid").exists(), "Postgres still running"
        assert (tmp_path / "state" / "temporal.db").exists()
    finally:
        if proc.poll() is None:  # a failed assertion: still stop the stack it started
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
