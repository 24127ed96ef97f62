"""Simulated agents: many workers heartbeating from one asyncio process.

Each worker beats by signal-with-start of ``liveness-{worker}`` (CONTRACT.md §2), exactly as
``reaper agent`` does, every ``interval`` seconds with its own phase, so that beats are spread
evenly over the interval. ``kill`` stops a worker's beats, as a SIGKILL of its agent would.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from temporalio.client import Client

from reaper.core.models import LivenessInput
from reaper.core.signing import sign_heartbeat
from workflows.common import liveness_id
from workflows.liveness import WorkerLiveness


@dataclass
class SimWorker:
    name: str
    reports: dict[str, list[str]] | None = None
    """Complete lists sent with every beat; ``None``: liveness-only beats."""
    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    seq: int = 0
    alive: bool = True
    next_due: float = 0.0
    last_sent: float | None = None
    """Wall-clock time (``time.time()``) at which the last beat was accepted by Temporal."""
    key: Ed25519PrivateKey | None = None
    """The agent's key: its beats are signed (CONTRACT.md §5.2) when set."""

    def payload(self, with_reports: bool = True) -> dict[str, Any]:
        beat: dict[str, Any] = {
            "worker": self.name,
            "boot_id": self.boot_id,
            "seq": self.seq,
            "sent_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if with_reports and self.reports is not None:
            beat.update(self.reports)
        self.seq += 1
        return beat if self.key is None else sign_heartbeat(beat, self.key)


async def send_beat(
    client: Client, task_queue: str, name: str, payload: dict[str, Any], workflow: str | None = None
) -> None:
    """One heartbeat by signal-with-start (to ``WorkerLiveness``, or to ``workflow`` by name
    with the id ``{workflow}-{name}`` for the baseline)."""
    if workflow is None:
        await client.start_workflow(
            WorkerLiveness.run,
            LivenessInput(worker=name),
            id=liveness_id(name),
            task_queue=task_queue,
            start_signal="heartbeat",
            start_signal_args=[payload],
        )
    else:
        await client.start_workflow(
            workflow,
            None,
            id=f"{workflow}-{name}",
            task_queue=task_queue,
            start_signal="heartbeat",
            start_signal_args=[payload],
        )


class SimFleet:
    """Workers beating every ``interval`` seconds until stopped (or killed one by one)."""

    def __init__(
        self,
        client: Client,
        task_queue: str,
        interval: float,
        concurrency: int = 64,
        workflow: str | None = None,
    ) -> None:
        """``workflow``: beat a baseline workflow of that name instead of ``WorkerLiveness``
        (see :func:`send_beat`)."""
        self.client = client
        self.tq = task_queue
        self.workflow = workflow
        self.interval = interval
        self.workers: dict[str, SimWorker] = {}
        self.sem = asyncio.Semaphore(concurrency)
        self.sent = 0
        self.errors = 0
        self.last_error: str | None = None
        self.max_lateness = 0.0
        """Seconds by which this process sent a beat later than due (it cannot keep up)."""
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()

    def add(self, workers: list[SimWorker], spread: float | None = None) -> None:
        """Add workers; their first beats are spread over ``spread`` seconds (default: now)."""
        now = time.monotonic()
        n = len(workers)
        for i, w in enumerate(workers):
            w.next_due = now + (spread or 0.0) * i / max(n, 1)
            self.workers[w.name] = w

    def kill(self, names: list[str]) -> None:
        for n in names:
            self.workers[n].alive = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            now = time.monotonic()
            for w in list(self.workers.values()):
                if w.alive and w.next_due <= now:
                    self.max_lateness = max(self.max_lateness, now - w.next_due)
                    w.next_due += self.interval
                    if w.next_due <= now:  # fell behind a whole interval: do not burst
                        w.next_due = now + self.interval
                    await self.sem.acquire()
                    t = asyncio.create_task(self._send(w))
                    self._inflight.add(t)
                    t.add_done_callback(self._inflight.discard)
            await asyncio.sleep(0.02)

    async def _send(self, w: SimWorker) -> None:
        try:
            await send_beat(self.client, self.tq, w.name, w.payload(), self.workflow)
            w.last_sent = time.time()
            self.sent += 1
        except Exception as exc:  # counted and shown; an agent keeps going
            self.errors += 1
            self.last_error = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        finally:
            self.sem.release()
