"""Progress on long CLI steps: a spinner on standard error when it is a terminal (connecting
to Temporal, listing and querying the workers), nothing when it is piped."""

from __future__ import annotations

import asyncio
import os
import pty
import select
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from reaper.kit.temporal import DevServer
from tests.support.controller import controller, make_settings
from tests.support.heartbeats import beat, query_state, send
from tests.support.polling import eventually


def on_a_terminal(*args: str, timeout: float = 60) -> tuple[int, str, str]:
    """``reaper ARGS`` with standard error on a pseudo-terminal: (exit status, what the
    terminal showed, standard output)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REAPER_")}
    env.update(TERM="xterm-256color", COLUMNS="120")
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "reaper.cli", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        cwd=Path(__file__).parent,
    )
    os.close(slave)
    shown = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, shown.decode(errors="replace"), out.decode()


async def test_connecting_shows_progress_on_a_terminal_only(dev_env: WorkflowEnvironment) -> None:
    where = dev_env.client.service_client.config.target_host
    code, shown, _ = await asyncio.to_thread(
        on_a_terminal, "drain", "ghost", "--reason", "test", "--address", where
    )
    assert code == 1, shown
    assert f"connecting to Temporal at {where}…" in shown, shown
    assert "unknown worker 'ghost'" in shown, shown

    piped = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "reaper.cli", "drain", "ghost", "--reason", "t", "--address", where],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert piped.returncode == 1
    assert piped.stderr.strip().count("\n") == 0 and "connecting" not in piped.stderr, piped


async def test_workers_shows_its_queries_on_a_terminal(
    pool: asyncpg.Pool, db_url: str, tmp_path: Path
) -> None:
    # A dev server of its own: the session's holds other tests' workflows, whose state
    # queries would wait for controllers long gone.
    server = DevServer(
        tmp_path / "temporal.log", db_file=tmp_path / "temporal.db", continue_as_new_after=30
    )
    await server.up()
    try:
        client = await eventually(
            lambda: _connect(server.address), bool, timeout=60, poll=0.2, what="a healthy frontend"
        )
        assert client is not None
        tq, worker = f"tq-{uuid.uuid4().hex[:8]}", f"prog-{uuid.uuid4().hex[:6]}"
        async with controller(client, pool, make_settings(), tq):
            await send(client, tq, beat(worker, 0))
            await eventually(lambda: query_state(client, worker), lambda s: s.last_seq == 0)
            code, shown, out = await asyncio.to_thread(
                on_a_terminal, "workers", "--address", server.address, "--database-url", db_url
            )
    finally:
        server.stop()
    assert code == 0, shown
    assert "querying the state of 1 workers…" in shown and "1 answered" in shown, shown
    assert worker in out  # the table itself is on standard output


async def _connect(address: str) -> Client | None:
    try:
        return await Client.connect(address, data_converter=pydantic_data_converter)
    except RuntimeError:
        return None
