"""Metric 6: resident memory of the controller process at two fleet sizes.

A controller of its own (``python worker.py``) on a fresh database; a simulated fleet grows
to the first size, then to the second, every worker beating (liveness only) every
``interval`` seconds. The RSS (psutil) is sampled for a few seconds at each size, after
the last batch registered, and the highest sample kept. Growing from the first size to the
second has a time budget: the size reached when it runs out is reported as such. The
controller's CPU time and the run times of some livenesses' workflow tasks are shown too.
"""

from __future__ import annotations

import asyncio
import os
import time

import asyncpg

from bench.common import fmt_bytes
from bench.env import Controller
from bench.result import Metric
from bench.throughput import cpu as cpu_of
from bench.throughput import temporal_processes
from reaper.kit.agents import SimAgent
from reaper.kit.fleet import SimFleet


async def sample_rss(ctl: Controller, seconds: float) -> int:
    peak = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, ctl.rss())
        await asyncio.sleep(0.25)
    return peak


async def grow(
    fleet: SimFleet,
    pool: asyncpg.Pool,
    sims: list[SimAgent],
    batch: int,
    deadline: float,
    progress,
) -> int:
    """Add ``sims`` to the beating fleet ``batch`` at a time, each batch once the previous one
    is registered, until all are or ``deadline`` (monotonic) passes; workers registered."""

    async def running() -> int:
        return await pool.fetchval("SELECT count(*) FROM reaper.workers WHERE state = 'running'")

    base = await running()
    start = time.monotonic()
    n = base
    for i in range(0, len(sims), batch):
        if time.monotonic() >= deadline:
            break
        part = sims[i : i + batch]
        fleet.add(part, spread=2.0)
        want = base + i + len(part)
        while (n := await running()) < want and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
        progress(f"  memory: {n} workers running after {time.monotonic() - start:.0f} s")
    return n


async def run(
    client, ctl: Controller, sizes: list[int], interval: float, budget: float, progress
) -> Metric:
    """``budget``: seconds allowed for growing from the first size to the last."""
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
    try:
        sims = [SimAgent(f"mem-{i:05d}") for i in range(max(sizes))]
        fleet.start()
        done = 0
        t = time.monotonic()
        for k, size in enumerate(sizes):
            deadline = t + (900.0 if k == 0 else budget)
            reached[size] = await grow(fleet, pool, sims[done:size], 250, deadline, progress)
            took[size] = time.monotonic() - t
            done = size
            rss[size] = await sample_rss(ctl, 3.0 if size >= 1000 else 1.0)
            cpu[size], server[size] = ctl.cpu_seconds(), cpu_of(temporal)
            load[size] = os.getloadavg()[0]
            progress(
                f"  memory: {reached[size]} workers registered, controller RSS "
                f"{fmt_bytes(rss[size])}"
            )
            t = time.monotonic()
            if reached[size] < size:
                break
    finally:
        await fleet.stop()
        await pool.close()
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
        f"{fleet.sent} beats sent (every {interval:g} s, liveness only), {fleet.errors} failed",
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
