"""Metric 7: the scale target (issue 11) on this machine.

``workers`` simulated agents heartbeat (liveness only) every ``hb`` seconds against two
controller replicas (``python worker.py`` twice, one task queue, one database), the first
beats of the fleet spread over one interval, as a fleet starting up would send them:

- 7a: seconds until every worker is ``running`` in Postgres (target: within ``budget``);
- 7b: workers that went ``stalled`` (an ``events`` row ``running -> stalled``) while they
  beat, over ``steady`` seconds of steady state after that (target: none);
- 7c: the highest resident memory of either replica over the run (target: < 1 GiB each);
- 7d: for ``silent`` workers whose agents stop a minute into the steady state, from
  Temporal's acceptance of their last beat to their ``-> lost`` events row (target:
  ``LOST_AFTER + 2 s``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import asyncpg
import psutil

from bench.common import fmt_bytes, sample_sum, scrape
from bench.env import BenchEnv, Controller, timings
from bench.floor import WATCH, watch_kill
from bench.history import spread
from bench.loss import graces
from bench.result import Metric, verdict
from reaper.kit.agents import SimAgent
from reaper.kit.fleet import SimFleet

GIB = 2**30


class Sampler:
    """The highest RSS of each replica, sampled every ``every`` seconds in the background,
    and the highest count of workflows in its SDK cache (``temporal_sticky_cache_size``)."""

    def __init__(self, replicas: list[Controller], every: float = 1.0) -> None:
        self.replicas, self.every = replicas, every
        self.peak = {c.name: 0 for c in replicas}
        self.cached = {c.name: 0 for c in replicas}
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        n = 0
        while True:
            for c in self.replicas:
                if c.alive():
                    self.peak[c.name] = max(self.peak[c.name], c.rss())
                    if n % 10 == 0:
                        cached = await asyncio.to_thread(sticky_cache_size, c)
                        self.cached[c.name] = max(self.cached[c.name], cached)
            n += 1
            await asyncio.sleep(self.every)

    def __enter__(self) -> Sampler:
        self._task = asyncio.get_running_loop().create_task(self._loop())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def sticky_cache_size(c: Controller) -> int:
    """Workflows in the replica's SDK cache now (its SDK metrics' gauge); 0 if unread."""
    try:
        return int(sample_sum(scrape(c.sdk_metrics_port, 5), "temporal_sticky_cache_size"))
    except OSError:
        return 0


@dataclass
class Floor:
    """The same fleet as ``BenchWatch`` workflows on the no-op worker (one process,
    unsandboxed, each beat restarting a timer of LOST_AFTER): the cheapest liveness of that
    size this dev server can run."""

    registered: int = 0
    took: float = 0.0
    rss: int = 0
    closes: list[float] = field(default_factory=list)


async def watch_floor(
    workers: int,
    hb: float,
    lost: float,
    give_up: float,
    budget: float,
    silent: int,
    progress: Callable[[str], None],
) -> Floor:
    """Grow ``workers`` ``BenchWatch`` workflows as 7a grows reaper's fleet (first beats
    spread over one interval), wait one interval, silence ``silent`` of them; the count of
    first beats handled within ``budget`` seconds, the no-op worker's peak RSS, and each
    silenced one's close after its last beat (within ``give_up`` seconds). On a stack of its
    own (dev server and Postgres), closed before reaper's phase: no workflow of the floor's
    is left on reaper's server."""
    env, out = await BenchEnv.start(), Floor()
    try:
        noop = env.start_noop_worker(f"bench-scale-floor-{uuid.uuid4().hex[:6]}", lost)
        await env.wait_noop(noop)
        proc = psutil.Process(noop.pid)
        fleet = SimFleet(
            env.client, noop.task_queue, hb, concurrency=128, overlap=True, workflow=WATCH
        )
        sims = [SimAgent(f"floor-{i:05d}") for i in range(workers)]
        fleet.start()
        try:
            t0 = time.monotonic()
            fleet.add(sims, spread=hb)
            while out.registered < workers and time.monotonic() - t0 < budget:
                await asyncio.sleep(1.0)
                out.registered = int(await asyncio.to_thread(noop.handled, True))
                out.rss = max(out.rss, proc.memory_info().rss)
            out.took = time.monotonic() - t0
            progress(f"  floor: {out.registered} of {workers} BenchWatch after {out.took:.0f} s")
            await asyncio.sleep(hb)
            doomed = [s.name for s in sims[:silent]]
            out.closes = await watch_kill(env.client, fleet, doomed, give_up)
            out.rss = max(out.rss, proc.memory_info().rss)
        finally:
            await fleet.stop()
    finally:
        await env.close()
    return out


async def _running(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM reaper.workers WHERE state = 'running'"))


async def _stalled_since(pool: asyncpg.Pool, since: datetime, exclude: set[str]) -> list[str]:
    rows = await pool.fetch(
        "SELECT DISTINCT worker FROM reaper.events WHERE kind = 'worker' AND action = 'state'"
        " AND reason LIKE 'running -> stalled%' AND at >= $1",
        since,
    )
    return sorted(r["worker"] for r in rows if r["worker"] not in exclude)


async def run(
    env: BenchEnv,
    workers: int,
    hb: float,
    stall: float,
    lost: float,
    steady: float,
    budget: float,
    silent: int,
    progress: Callable[[str], None],
) -> list[Metric]:
    """Measure 7a-7d, each beside its floor (:func:`watch_floor`, run first, on a stack of
    its own on the same machine); ``budget`` and ``steady`` in seconds."""
    floor = await watch_floor(workers, hb, lost, lost + stall + 2 * hb, budget, silent, progress)
    a = await env.start_controller("scale-a", timings(hb, stall, lost))
    b = await env.start_controller("scale-b", a.timings, replica_of=a)
    progress(f"controllers 'scale-a' pid {a.pid} and 'scale-b' pid {b.pid} ({a.timings})")
    pool = await asyncpg.create_pool(a.db_url, min_size=1, max_size=2)
    fleet = SimFleet(env.client, a.task_queue, hb, concurrency=128, overlap=True)
    sims = [SimAgent(f"scale-{i:05d}") for i in range(workers)]
    try:
        with Sampler([a, b]) as rss:
            fleet.start()
            t0 = time.monotonic()
            fleet.add(sims, spread=hb)
            n = 0
            while (n := await _running(pool)) < workers and time.monotonic() - t0 < budget:
                await asyncio.sleep(1.0)
                if int(time.monotonic() - t0) % 30 == 0:
                    progress(f"  scale: {n} of {workers} running")
            took = time.monotonic() - t0
            progress(f"  scale: {n} of {workers} running after {took:.0f} s")
            steady_from = datetime.now(UTC)
            t1 = time.monotonic()
            await asyncio.sleep(min(hb, steady / 4))
            victims = sims[:silent]
            judged = await pool.fetchval(
                "SELECT count(*) FROM reaper.workers WHERE name = ANY($1) AND state = 'running'",
                [v.name for v in victims],
            )
            fleet.kill([v.name for v in victims])
            killed_at = time.monotonic()
            left = steady - (killed_at - t1)
            # Long enough for a late judgement too (a loaded controller's outage grace adds
            # STALL_AFTER), so that 7d measures how late, not whether.
            await asyncio.sleep(max(left, lost + stall + 2 * hb - (time.monotonic() - killed_at)))
            stalled = await _stalled_since(pool, steady_from, {v.name for v in victims})
            lost_at = {
                r["worker"]: r["at"]
                for r in await pool.fetch(
                    "SELECT worker, min(at) AS at FROM reaper.events WHERE kind = 'worker'"
                    " AND action = 'state' AND reason LIKE '% -> lost%' AND worker = ANY($1)"
                    " GROUP BY worker",
                    [v.name for v in victims],
                )
            }
            steady_s = time.monotonic() - t1
            n_end = await _running(pool)
    finally:
        await fleet.stop()
        await pool.close()
        a.stop()
        b.stop()
    delays = [
        (lost_at[v.name].timestamp() - v.last_sent)
        for v in victims
        if v.name in lost_at and v.last_sent is not None
    ]
    worst_rss = max(rss.peak.values())
    g = graces({v.name for v in victims}, a, b)
    common = [
        f"{workers:,} workers beating every {hb:g} s (liveness only), 2 replicas on one task "
        f"queue; STALL_AFTER {stall:g} s, LOST_AFTER {lost:g} s; {fleet.sent:,} beats sent, "
        f"{fleet.errors} failed, the bench sent beats up to {fleet.max_lateness:.1f} s late"
    ]
    m7a = Metric(
        "7a",
        f"{n:,} of {workers:,} running after {took:.0f} s",
        f"all within {budget:g} s",
        verdict(n == workers),
        [
            *common,
            f"the floor: {floor.registered:,} of {workers:,} {WATCH} workflows grown the same "
            f"way on the no-op worker (one process) had handled their first beat after "
            f"{floor.took:.0f} s",
        ],
    )
    unfinished = (
        f" (not judged: registration unfinished, {n_end:,} running at the end)"
        if n != workers
        else ""
    )
    m7b = Metric(
        "7b",
        f"{len(stalled)} workers stalled while beating over {steady_s:.0f} s{unfinished}",
        "0",
        verdict(not stalled and n == workers),
        [f"first ones: {', '.join(stalled[:5])}"] if stalled else [],
    )
    m7c = Metric(
        "7c",
        " / ".join(f"{k} {fmt_bytes(v)}" for k, v in rss.peak.items()),
        "< 1 GiB each",
        verdict(worst_rss < GIB),
        [
            f"{fmt_bytes(sum(rss.peak.values()) / max(n_end, 1))} per worker (both peaks over "
            f"the {n_end:,} running at the end)",
            "workflows in each replica's SDK cache at most (temporal_sticky_cache_size): "
            + " / ".join(f"{k} {v:,}" for k, v in rss.cached.items()),
            f"the floor: the no-op worker holding {floor.registered:,} {WATCH} workflows, "
            f"{fmt_bytes(floor.rss)} at most "
            f"({fmt_bytes(floor.rss / max(floor.registered, 1))} per workflow)",
        ],
    )
    m7d = Metric(
        "7d",
        (
            f"median {sorted(delays)[len(delays) // 2]:.2f} s, max {max(delays):.2f} s "
            f"({len(delays)} of {silent} lost)"
            if delays
            else f"none of {silent} lost"
        ),
        f"<= {lost + 2:g} s",
        verdict(bool(delays) and len(delays) == silent and max(delays) <= lost + 2),
        [
            f"{judged} of the {silent} silent workers were running in Postgres when their "
            "beats stopped (one not yet registered has no deadline to judge)",
            f"outage grace (a deadline judged more than HEARTBEAT_INTERVAL late extends "
            f"LOST_AFTER by STALL_AFTER; both replicas' logs): {g[0]} times for {g[1]} of the "
            f"silent workers, {g[2]} times for others",
            f"the floor: {silent} {WATCH} workflows silenced the same way closed "
            + (f"{spread(floor.closes)} after their last beat" if floor.closes else "not at all")
            + f" ({len(floor.closes)} of {silent})",
        ],
    )
    return [m7a, m7b, m7c, m7d]
