"""Simulated agents heartbeating in the background against a real dev server."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from temporalio.client import Client

from tests.support.heartbeats import beat, send


class Agents:
    """Simulated agents, one per key of ``reports``, each beating every ``interval`` seconds
    with its complete report (``reports[worker]``: kind -> handles; change it to drop or add
    handles). All agents beat together, concurrently; a failed beat is skipped (an agent
    keeps trying through an outage). Use as a context manager inside a running loop."""

    def __init__(self, client: Client, task_queue: str, interval: float = 1.0) -> None:
        self.client, self.tq, self.interval = client, task_queue, interval
        self.reports: dict[str, dict[str, Any]] = {}
        self.seq = 0
        self._task: asyncio.Task[None] | None = None

    async def _send(self, worker: str, reports: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):
            await send(self.client, self.tq, beat(worker, self.seq, **reports))

    async def _loop(self) -> None:
        while True:
            self.seq += 1
            await asyncio.gather(*(self._send(w, r) for w, r in list(self.reports.items())))
            await asyncio.sleep(self.interval)

    def __enter__(self) -> Agents:
        self._task = asyncio.get_running_loop().create_task(self._loop())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
