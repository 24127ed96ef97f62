"""The real ``temporal`` CLI, as an operator's shell runs it against a test's dev server."""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.context
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from tests.support import cli_child
from tests.support.controller import find_binary

_forks: multiprocessing.context.ForkServerContext | None = None
_forks_lock = threading.Lock()


def _fork_server() -> multiprocessing.context.ForkServerContext:
    """A fork server (started on first use) that has imported ``reaper.cli``: each command
    forked from it starts in milliseconds instead of spending about 0.6 s of CPU importing
    Temporal's client, pydantic and typer again (the e2e processes run the command a hundred
    times or more: a tenth of their CPU)."""
    global _forks
    with _forks_lock:
        if _forks is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["reaper.cli", "tests.support.cli_child"])
            _forks = ctx
        return _forks


def reaper(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``reaper ARGS`` in a fresh process (forked from a server that has imported the
    CLI, :mod:`tests.support.cli_child`) in ``cwd`` (this directory by default); no ``.env``
    or ``REAPER_*`` of the caller leaks in."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("REAPER_")}
    full_env.update(env or {})
    argv = [sys.executable, "-m", "reaper.cli", *args]
    with tempfile.TemporaryDirectory(prefix="reaper-cli-") as tmp:
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        proc = _fork_server().Process(
            target=cli_child.run,
            args=(list(args), full_env, str(cwd or Path(__file__).parent), str(out), str(err)),
        )
        proc.start()
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired(argv, timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess(argv, proc.exitcode, out.read_text(), err.read_text())


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


def start_run(tmp_path: Path, *args: str, **settings: str) -> tuple[subprocess.Popen[bytes], Path]:
    """``python -m reaper.cli run *args`` in ``tmp_path``, with none of this process's
    ``REAPER_*`` variables but ``settings`` (``REAPER_UI_PORT="8234"`` ...); its output in
    ``tmp_path / "run.log"``. Returns the process and the log's path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REAPER_")}
    env.update(settings, PYTHONUNBUFFERED="1")
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reaper.cli", "run", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    return proc, log
