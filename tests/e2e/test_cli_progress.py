"""Progress on long CLI steps: a spinner on standard error when it is a terminal (connecting
to Temporal, listing and querying the workers), nothing when it is piped."""

from __future__ import annotations

import asyncio
import os
import pty
import subprocess
import sys
from pathlib import Path

from temporalio.testing import WorkflowEnvironment


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
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, shown.decode(errors="replace"), out.decode()


def address(env: WorkflowEnvironment) -> str:
    return env.client.service_client.config.target_host


async def test_long_steps_show_progress_on_a_terminal_only(dev_env: WorkflowEnvironment) -> None:
    where = address(dev_env)
    code, shown, _ = await asyncio.to_thread(
        on_a_terminal, "drain", "ghost", "--reason", "test", "--address", where
    )
    assert code == 1, shown
    assert f"connecting to Temporal at {where}…" in shown, shown
    assert "unknown worker 'ghost'" in shown, shown

    code, shown, out = await asyncio.to_thread(on_a_terminal, "workers", "--address", where)
    assert code == 0, shown
    assert "querying the state of" in shown and "workers…" in shown, shown
    assert "workers" in out  # the table itself goes to standard output

    piped = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "reaper.cli", "drain", "ghost", "--reason", "t", "--address", where],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert piped.returncode == 1
    assert piped.stderr.strip().count("\n") == 0 and "connecting" not in piped.stderr, piped
