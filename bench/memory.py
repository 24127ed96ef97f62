"""Metrics 6 and 8b: a fleet that boots at once, registered, and the controller's memory.

A controller of its own (``python worker.py``) on a fresh database; a simulated fleet grows
to the first size, then to the second, every worker beating (liveness only) every
``interval`` seconds. Each step adds its workers at once: their first beats are sent as fast
as 64 calls in flight allow, as when a zone comes back from an outage or a new cluster
boots. Each step is timed until every worker is ``running`` in ``reaper.workers``; growing
from the first size to the second has a time budget, and the size reached when it runs out
is reported as such.

- 6: the controller's RSS (psutil), sampled for a few seconds once a step is registered,
  the highest sample kept; its CPU time and the dev server's while growing.
- 8b: registrations per second at each step against the same fleet of ``BenchNoop``
  workflows (bench/noop.py, unsandboxed; its first signals counted by the no-op worker
  itself), grown the same way on the same dev server before reaper's. Target (issue 20):
  the whole fleet of the second size registered within ``budget`` seconds.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg

from bench.common import Progress, fmt_bytes
from bench.env import BenchEnv, Controller, NoopWorker
from bench.result import Metric, verdict
from bench.server import cpu as cpu_of
from bench.server import temporal_processes
from reaper.kit.agents import SimAgent
from reaper.kit.fleet import SimFleet

NOOP = "BenchNoop"


async def sample_rss(ctl: Controller, seconds: float) -> int:
    peak = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, ctl.rss())
        await asyncio.sleep(0.25)
    return peak


async def grow(
    fleet: SimFleet,
    registered: Callable[[], Awaitable[int]],
    sims: list[SimAgent],
    want: int,
    deadline: float,
    progress: Progress,
    label: str,
) -> int:
    """Add ``sims`` to the beating fleet at once and wait until ``registered()`` reaches
    ``want`` or ``deadline`` (monotonic) passes; the count reached."""
    start = time.monotonic()
    fleet.add(sims)
    n = await registered()
    shown = start
    while n < want and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        n = await registered()
        if time.monotonic() - shown >= 15:
            shown = time.monotonic()
            progress(f"  {label}: {n} registered after {shown - start:.0f} s")
    progress(f"  {label}: {n} registered after {time.monotonic() - start:.0f} s")
    return n


async def noop_rates(
    env: BenchEnv, sizes: list[int], interval: float, budget: float, progress: Progress
) -> dict[int, tuple[int, float]]:
    """The no-op fleet grown like reaper's: ``{size: (registered, seconds)}``."""
    noop: NoopWorker = env.start_noop_worker(f"bench-reg-noop-{uuid.uuid4().hex[:6]}")
    await env.wait_noop(noop)
    fleet = SimFleet(env.client, noop.task_queue, interval, overlap=True, workflow=NOOP)
    out: dict[int, tuple[int, float]] = {}

    async def registered() -> int:
        return int(await asyncio.to_thread(noop.handled, True))

    sims = [SimAgent(f"reg-{i:05d}") for i in range(max(sizes))]
    fleet.start()
    try:
        done = 0
        for k, size in enumerate(sizes):
            t = time.monotonic()
            deadline = t + (900.0 if k == 0 else budget)
            n = await grow(fleet, registered, sims[done:size], size, deadline, progress, "no-op")
            out[size] = (n, time.monotonic() - t)
            done = size
            if n < size:
                break
    finally:
        await fleet.stop()
        noop.stop()
    return out


async def run(
    env: BenchEnv,
    ctl: Controller,
    sizes: list[int],
    interval: float,
    budget: float,
    progress: Progress,
) -> list[Metric]:
    """``budget``: seconds allowed for growing from the first size to the last."""
    client = env.client
    base = await noop_rates(env, sizes, interval, budget, progress)
    pool = await asyncpg.create_pool(ctl.db_url, min_size=1, max_size=2)
    fleet = SimFleet(client, ctl.task_queue, interval, overlap=True)
    idle = await sample_rss(ctl, 1.0)
    rss: dict[int, int] = {}
    reached: dict[int, int] = {}
    took: dict[int, float] = {}
    cpu: dict[int, float] = {}
    server: dict[int, float] = {}
    load: dict[int, float] = {}
    temporal = temporal_processes()
    cpu0, server0 = ctl.cpu_seconds(), cpu_of(temporal)

    async def running() -> int:
        return int(
            await pool.fetchval("SELECT count(*) FROM reaper.workers WHERE state = 'running'")
        )

    try:
        sims = [SimAgent(f"mem-{i:05d}") for i in range(max(sizes))]
        fleet.start()
        done = 0
        for k, size in enumerate(sizes):
            t = time.monotonic()
            deadline = t + (900.0 if k == 0 else budget)
            reached[size] = await grow(
                fleet, running, sims[done:size], size, deadline, progress, "memory"
            )
            took[size] = time.monotonic() - t
            done = size
            cpu[size], server[size] = ctl.cpu_seconds(), cpu_of(temporal)
            load[size] = os.getloadavg()[0]
            rss[size] = await sample_rss(ctl, 3.0 if size >= 1000 else 1.0)
            progress(f"  memory: {reached[size]} workers, controller RSS {fmt_bytes(rss[size])}")
            if reached[size] < size:
                break
    finally:
        await fleet.stop()
        await pool.close()
    return [
        _memory(sizes, idle, rss, reached, took, cpu, server, load, cpu0, server0, budget, fleet),
        _rates(sizes, reached, took, base, budget),
    ]


def _rates(
    sizes: list[int],
    reached: dict[int, int],
    took: dict[int, float],
    base: dict[int, tuple[int, float]],
    budget: float,
) -> Metric:
    last = sizes[-1]
    parts, details = [], []
    prev_r = prev_n = prev_size = 0
    for s in sizes:
        if s not in reached:
            break
        r_rate = (reached[s] - prev_r) / took[s]
        n_got, n_took = base.get(s, (0, 0.0))
        n_rate = (n_got - prev_n) / n_took if n_took else 0.0
        parts.append(
            f"{r_rate:.1f} vs {n_rate:.0f}/s = {r_rate / n_rate if n_rate else 0:.2f} to {s:,}"
        )
        details.append(
            f"{s - prev_size:,} workers added at once to {prev_size:,}: reaper had {reached[s]:,} "
            f"registered after {took[s]:.1f} s; the same number of BenchNoop ids: the no-op had "
            f"handled {n_got:,} first signals after {n_took:.1f} s"
        )
        prev_r, prev_n, prev_size = reached[s], n_got, s
    total = sum(took[s] for s in took)
    ok = reached.get(last, 0) >= last and total <= budget
    value = "; ".join(parts) + f"; {reached.get(last, 0):,} of {last:,} in {total:.0f} s"
    return Metric("8b", value, f"{last:,} within {budget:g} s", verdict(ok), details)


def _memory(
    sizes: list[int],
    idle: int,
    rss: dict[int, int],
    reached: dict[int, int],
    took: dict[int, float],
    cpu: dict[int, float],
    server: dict[int, float],
    load: dict[int, float],
    cpu0: float,
    server0: float,
    budget: float,
    fleet: SimFleet,
) -> Metric:
    a = sizes[0]
    last = max(rss)
    # Per window (idle -> first size -> last size): CPU seconds per worker added, cores.
    prev = {"n": 0, "cpu": cpu0, "server": server0}
    window: dict[int, tuple[float, float, float]] = {}
    for s_ in rss:
        added = max(reached[s_] - prev["n"], 1)
        window[s_] = (
            (cpu[s_] - prev["cpu"]) / added,
            (cpu[s_] - prev["cpu"]) / took[s_],
            (server[s_] - prev["server"]) / took[s_],
        )
        prev = {"n": reached[s_], "cpu": cpu[s_], "server": server[s_]}
    rate = {s: (reached[s] - (reached[a] if s != a else 0)) / took[s] for s in rss}
    details = [
        f"idle controller {fmt_bytes(idle)}; "
        + "; ".join(
            f"{reached[s]} workers registered: {fmt_bytes(rss[s])} (in {took[s]:.0f} s, "
            f"{rate[s]:.1f} registrations/s)"
            for s in rss
        ),
        "while growing to "
        + "; to ".join(
            f"{reached[s]:,}: controller {window[s][0] * 1000:.0f} ms of CPU per worker added, "
            f"{window[s][1]:.2f} cores, dev server {window[s][2]:.2f} cores, load average "
            f"{load[s]:.1f}"
            for s in rss
        ),
        f"{fleet.sent} beats sent (every {fleet.interval:g} s, liveness only), {fleet.errors} "
        "failed; each size's workers added at once (before issue 20: in batches of 250, each "
        "once the one before was registered)",
    ]
    value = " / ".join(f"{fmt_bytes(rss[s])} at {reached[s]:,}" for s in rss) + " workers"
    m = Metric("6", value, "(reported)", "INFO", details)
    if reached[last] < last:
        m.value += f" (only {reached[last]:,} of {last:,} registered within {budget:g} s)"
        m.why = (
            f"registrations went from {rate[a]:.1f}/s up to {a:,} workers to "
            f"{rate[last]:.1f}/s beyond, each added worker costing the controller "
            f"{window[last][0] * 1000:.0f} ms of CPU instead of {window[a][0] * 1000:.0f} "
            f"ms (the beats of the growing fleet included); the controller ran at "
            f"{window[last][1]:.2f} cores and the dev server at {window[last][2]:.2f} on 2 "
            f"cores at load average {load[last]:.1f}"
        )
    elif len(rss) > 1:
        m.details.append(
            f"{fmt_bytes((rss[last] - rss[a]) / (last - a))} per worker between "
            f"{a:,} and {last:,}; {fmt_bytes((rss[a] - idle) / a)} per worker up "
            f"to {a:,}"
        )
    return m
