"""The baseline of the heartbeat throughput: a workflow whose ``heartbeat`` handler only counts.

``python -m bench.noop ADDRESS TASK_QUEUE`` runs it in a worker process of its own, with the
same ``Worker`` settings and data converter as the controller (worker.py), so that the bench
compares reaper's ``WorkerLiveness`` with the cheapest possible signal handler on the same
server.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from temporalio import workflow


@workflow.defn(name="BenchNoop")
class BenchNoop:
    """Counts ``heartbeat`` signals; query ``last_seq`` returns the highest ``seq`` seen."""

    def __init__(self) -> None:
        self.count = 0
        self.last_seq = -1

    @workflow.signal(name="heartbeat")
    def heartbeat(self, raw: Any) -> None:
        self.count += 1
        if isinstance(raw, dict) and isinstance(raw.get("seq"), int):
            self.last_seq = max(self.last_seq, raw["seq"])

    @workflow.query(name="last_seq")
    def get_last_seq(self) -> int:
        return self.last_seq

    @workflow.run
    async def run(self, _: Any) -> None:
        await workflow.wait_condition(lambda: self.count < 0)  # never: lives like a liveness


async def _serve(address: str, task_queue: str) -> None:
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Worker

    client = await Client.connect(address, data_converter=pydantic_data_converter)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    from bench.noop import BenchNoop as Noop  # not __main__'s copy: the sandbox imports it
    from reaper.infra.temporal import workflow_runner

    # The same settings as worker.py's controller Worker.
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[Noop],
        max_concurrent_activities=64,
        workflow_runner=workflow_runner(),
    ):
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1], sys.argv[2]))
    sys.stdout.flush()
    os._exit(0)  # the SDK can abort at interpreter exit (docs/platform-notes.md)
