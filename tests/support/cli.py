"""The real ``temporal`` CLI, as an operator's shell runs it against a test's dev server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from tests.support.controller import find_binary


def reaper(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``reaper ARGS`` in a fresh process; no ``.env`` or ``REAPER_*`` of the caller
    leaks in."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("REAPER_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "reaper.cli", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).parent,
    )


async def run_cli(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``reaper`` in a thread, so an in-process controller keeps serving meanwhile."""
    return await asyncio.to_thread(reaper, *args, env=env)


async def temporal(address: str, *args: str, timeout: float = 30.0) -> str:
    """Run ``temporal ARGS --address ADDRESS``; its output. Fails the test on a non-zero
    exit."""
    proc = await asyncio.create_subprocess_exec(
        find_binary("temporal"),
        *args,
        "--address",
        address,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=timeout)
    assert proc.returncode == 0, out.decode()
    return out.decode()


async def signal(address: str, workflow_id: str, name: str, raw_json: str) -> None:
    """``temporal workflow signal`` with raw JSON input."""
    await temporal(
        address,
        "workflow",
        "signal",
        "--workflow-id",
        workflow_id,
        "--name",
        name,
        "--input",
        raw_json,
    )


async def terminate(address: str, workflow_id: str, reason: str) -> None:
    """``temporal workflow terminate``, as an operator would a stuck workflow."""
    await temporal(
        address, "workflow", "terminate", "--workflow-id", workflow_id, "--reason", reason
    )
