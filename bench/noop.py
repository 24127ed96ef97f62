"""The baselines of the bench: the cheapest workflows Temporal's Python SDK can run.

``python -m bench.noop ADDRESS TASK_QUEUE METRICS_PORT`` runs them in a worker process of
their own, with the SDK's default ``Worker`` settings, the default data converter and **no
sandbox** (``UnsandboxedWorkflowRunner``): the floor reaper is measured against is the
cheapest way to do the same work in Python, not a workflow that carries reaper's own overheads
(the sandbox, the pydantic converter). Two settings differ from the SDK's defaults, both
capacity, not overhead, and both the controller's: the workflow cache holds 10,000 workflows
(the default, 1,000, would make the no-op replay its history on every beat once metric 8b's
fleet passes 1,000 workflows), and the workflow-task polls are the controller's default
``REAPER_WORKFLOW_TASK_POLLERS``, half on the shared queue (``workflow_task_polling``; at the
SDK's 5, one on the shared queue, a fleet's first signals queue behind one poll).

- ``BenchNoop``: a workflow whose ``heartbeat`` handler only counts (metrics 1, 8 and 9: a
  beat, a registration by signal-with-start of a new id);
- ``BenchSleeper``: a workflow that sleeps for its input's seconds and ends (metric 4a: the
  timer a judgement after ``LOST_AFTER`` cannot beat).
- ``BenchWatch``: the cheapest liveness, a ``BenchNoop`` whose every beat restarts one timer
  of ``BENCH_WATCH_SECONDS`` (the worker process's environment, default 30) and which ends
  when that timer fires (metric 4a's floor under a fleet's load: a loss judged with no rule,
  no row and no reap).

The bench learns that a signal was handled without asking Temporal (a query would cost the
server a round trip to this worker): the process counts handled signals in a Prometheus
counter, ``bench_noop_signals_total`` (and ``bench_noop_first_signals_total``: workflows
that handled their first signal, i.e. registrations), served on ``METRICS_PORT``. A replay
(after a cache eviction) does not count a signal again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import timedelta
from typing import Any

from prometheus_client import Counter
from temporalio import workflow

WATCH_SECONDS = float(os.environ.get("BENCH_WATCH_SECONDS", "30"))
"""``BenchWatch``'s silence before it ends, seconds; one value per worker process."""

HANDLED = Counter("bench_noop_signals", "heartbeat signals handled by BenchNoop (not replays)")
FIRST = Counter("bench_noop_first_signals", "BenchNoop workflows that handled their first signal")


@workflow.defn(name="BenchNoop")
class BenchNoop:
    """Counts ``heartbeat`` signals; query ``last_seq`` returns the highest ``seq`` seen."""

    def __init__(self) -> None:
        self.count = 0
        self.last_seq = -1

    @workflow.signal(name="heartbeat")
    def heartbeat(self, raw: Any) -> None:
        self.count += 1
        if not workflow.unsafe.is_replaying():
            HANDLED.inc()
            if self.count == 1:
                FIRST.inc()
        if isinstance(raw, dict) and isinstance(raw.get("seq"), int):
            self.last_seq = max(self.last_seq, raw["seq"])

    @workflow.query(name="last_seq")
    def get_last_seq(self) -> int:
        return self.last_seq

    @workflow.run
    async def run(self, _: Any) -> None:
        await workflow.wait_condition(lambda: self.count < 0)  # never: lives like a liveness


@workflow.defn(name="BenchWatch")
class BenchWatch(BenchNoop):
    """``BenchNoop`` that ends after ``WATCH_SECONDS`` without a beat: each beat cancels the
    timer and starts another (``workflow.wait_condition`` with a timeout), as a liveness
    with no rule, no row and no reap would."""

    @workflow.run
    async def run(self, _: Any) -> None:
        while True:
            seen = self.count

            def beat_came(seen: int = seen) -> bool:
                return self.count != seen

            try:
                await workflow.wait_condition(
                    beat_came,
                    timeout=timedelta(seconds=WATCH_SECONDS),
                )
            except TimeoutError:
                return  # silent for WATCH_SECONDS: "lost"


@workflow.defn(name="BenchSleeper")
class BenchSleeper:
    """Sleeps ``seconds`` (its input, a number) with one timer, then ends."""

    @workflow.run
    async def run(self, seconds: float) -> None:
        await workflow.sleep(timedelta(seconds=seconds))


async def _serve(address: str, task_queue: str, metrics_port: int) -> None:
    from prometheus_client import start_http_server
    from temporalio.client import Client
    from temporalio.worker import UnsandboxedWorkflowRunner, Worker

    from reaper.core.config import Settings
    from reaper.infra.temporal import workflow_task_polling

    start_http_server(metrics_port, addr="127.0.0.1")
    client = await Client.connect(address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # The SDK's defaults but for the runner (no sandbox), a cache that holds every workflow
    # and the controller's default polls: capacity settings, not overheads, so the floor
    # has them as reaper has.
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[BenchNoop, BenchWatch, BenchSleeper],
        workflow_runner=UnsandboxedWorkflowRunner(),
        max_cached_workflows=Settings.model_fields["workflow_cache"].default,
        **workflow_task_polling(Settings.model_fields["workflow_task_pollers"].default),
    ):
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    sys.stdout.flush()
    os._exit(0)  # the SDK can abort at interpreter exit (docs/platform-notes.md)
