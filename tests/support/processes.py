"""Real child processes a test can signal, SIGKILL, stop and restart: the controller
(``python worker.py``) and a Temporal dev server of the test's own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

from reaper.core.contract import SEARCH_ATTRIBUTES
from reaper.kit.processes import free_port, is_listening
from tests.support.controller import find_binary
from tests.support.paths import ROOT
from tests.support.polling import eventually


class ChildProcess:
    """A child process that a test can signal, SIGKILL and stop (``proc`` set by ``start``)."""

    proc: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(10)

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)  # in case a test left it stopped
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class ControllerProcess(ChildProcess):
    """``python worker.py`` as a child process that a test can SIGKILL and restart."""

    def __init__(
        self,
        address: str,
        db_url: str,
        log: Path,
        timings: dict[str, str],
        task_queue: str | None = None,
    ) -> None:
        """``timings``: ``REAPER_*`` variables (short timings) for the controller;
        ``task_queue``: another replica's, to share its work (a fresh one when omitted)."""
        self.task_queue = task_queue or f"tq-{uuid.uuid4().hex[:8]}"
        self.env = {
            **os.environ,
            # No metrics endpoints unless a test asks (``timings``): controllers of parallel
            # runs on one host would contend for the default ports.
            "REAPER_METRICS_PORT": "0",
            "REAPER_SDK_METRICS_PORT": "0",
            **timings,
            "REAPER_TEMPORAL_ADDRESS": address,
            "REAPER_DATABASE_URL": db_url,
            "REAPER_TASK_QUEUE": self.task_queue,
            "PYTHONUNBUFFERED": "1",
        }
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "worker.py")],
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    @property
    def identity(self) -> str:
        """The Temporal identity of the running process (the SDK's default, ``pid@host``),
        as recorded in the ``WorkflowTaskStarted`` and ``ActivityTaskStarted`` events it
        handled."""
        assert self.proc is not None
        return f"{self.proc.pid}@{socket.gethostname()}"

    def tail(self, lines: int = 40) -> str:
        """The log's last lines, without tracebacks and the SDK's connection-retry noise."""
        if not self.log.exists():
            return ""
        kept = [
            ln
            for ln in self.log.read_text(errors="replace").splitlines()
            if ln.strip() and not ln.startswith((" ", "Traceback")) and "retried" not in ln
        ]
        return "\n".join(kept[-lines:])


class DevServer(ChildProcess):
    """A Temporal dev server of the test's own, on a fixed port with its state in a SQLite
    file, so that it can be SIGKILLed and started again where it left off.

    With ``web_ui``, it serves its Web UI on ``ui_url`` (the search attributes registered at
    start, as ``reaper run`` does) and keeps the default continue-as-new threshold, so a
    page shows one run for the length of a test; without, it is headless and suggests
    continue-as-new every ~30 events, as the session's dev server does
    (tests/e2e/conftest.py), unless ``short_runs`` is False.
    """

    def __init__(self, root: Path, web_ui: bool = False, short_runs: bool = True) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = root / "temporal.log"
        self.ui_port = free_port() if web_ui else None
        self.ui_url = f"http://127.0.0.1:{self.ui_port}" if web_ui else None
        self.argv = [
            find_binary("temporal"),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--db-filename",
            str(root / "temporal.db"),
            "--log-level",
            "warn",
            "--dynamic-config-value",
            "frontend.enableServerVersionCheck=false",
        ]
        if self.ui_port is None:
            self.argv += ["--headless"]
            if short_runs:
                self.argv += [
                    "--dynamic-config-value",
                    "limit.historyCount.suggestContinueAsNew=30",
                ]
        else:
            self.argv += ["--ui-port", str(self.ui_port), "--ui-disable-news-fetch"]
        # Registered from the start: an in-process controller (unlike worker.py) registers
        # none, and a workflow that upserts an unknown one fails every workflow task.
        for name, kind in SEARCH_ATTRIBUTES.items():
            self.argv += ["--search-attribute", f"{name}={kind.capitalize()}"]
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )

        async def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"the dev server exited ({self.proc.returncode}):\n"
                    + self.log.read_text(errors="replace")[-3000:]
                )
            up = is_listening("127.0.0.1", self.port, timeout=0.2)
            return up and (self.ui_port is None or is_listening("127.0.0.1", self.ui_port, 0.2))

        await eventually(up, bool, timeout=30, poll=0.05, what="the dev server listening")
