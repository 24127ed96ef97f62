"""Metrics 8a and 9: what one registration and one steady beat cost the Temporal server,
against the cheapest workflow doing the same (bench/noop.py, unsandboxed), in the same run.

A controller of its own runs at the contract's default timings (``COST_TIMINGS``: heartbeat
10 s, stall 30 s ...; ``--quick`` divides them by 5, which keeps every proportion that
decides what a beat costs). On the same dev server:

1. idle: the server and the no-op worker, nobody beating; their rates are subtracted from
   the no-op's windows below (and the idle rates with the controller running, its fleet
   monitor's checks included, from reaper's);
2. no-op registration: ``workers`` signal-with-starts of new ``BenchNoop`` ids, 64 in flight,
   until the no-op worker has handled every signal (its own counter, no query); then the same
   workers beat every ``HEARTBEAT_INTERVAL`` for one ``STALL_AFTER``, the steady window;
3. the no-op worker stopped and the controller started: reaper registration: ``workers``
   first beats (signal-with-start of new liveness ids) until
   every worker is ``running`` in ``reaper.workers``; then its steady window likewise.

Per registration and per beat: the dev server's CPU (psutil) and its own counters (gRPC
calls at the frontend, calls between its services, persistence and visibility operations,
bench/server.py), the history events (bench/anatomy.py, from a sample of the histories), and
the controller's (or the no-op worker's) CPU. Targets (issue 20): at most 1.3 times the
no-op's server CPU, events and RPCs, each.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import asyncpg

from bench import anatomy
from bench.common import Progress, fmt_bytes, gather_limited, wait_until
from bench.env import BenchEnv, Controller, NoopWorker
from bench.result import Metric, verdict
from bench.server import ServerCost, ServerMeter, cost_between
from reaper.kit.agents import SimAgent, send_heartbeat
from reaper.kit.fleet import SimFleet
from workflows.common import liveness_id

NOOP = "BenchNoop"
LIMIT = 1.3
COST_TIMINGS = {
    "REAPER_HEARTBEAT_INTERVAL": "10s",
    "REAPER_STALL_AFTER": "30s",
    "REAPER_LOST_AFTER": "300s",
    "REAPER_MISSING_TTL": "300s",
    "REAPER_RESYNC_INTERVAL": "30s",
    "REAPER_FULL_RESYNC_INTERVAL": "600s",
}
"""CONTRACT.md §1 and §5.3's defaults (and reaper's FULL_RESYNC_INTERVAL)."""


def scaled_timings(k: float) -> dict[str, str]:
    """``COST_TIMINGS`` multiplied by ``k`` (``--quick``: 0.2)."""
    return {key: f"{float(v.rstrip('s')) * k:g}s" for key, v in COST_TIMINGS.items()}


@dataclass
class Side:
    """One side's figures for one kind of work (a registration or a beat)."""

    n: int
    server: ServerCost
    """Per unit, idle subtracted."""
    events: anatomy.Anatomy
    worker_cpu: float
    """CPU seconds of the workflow worker process per unit (controller or no-op worker)."""
    seconds: float

    @property
    def events_per(self) -> float:
        return self.events.count / max(self.events.beats, 1)


class Probe:
    """Reads the dev server and a worker process before and after a window; subtracts the
    idle rates measured by :meth:`idle` (the server's own, and the controller's fleet
    monitor once the controller runs: a cost per cluster, not per worker)."""

    def __init__(self, server: ServerMeter, noop: NoopWorker) -> None:
        self.server, self.noop = server, noop
        self.ctl: Controller | None = None
        self.idle_server = ServerCost()
        self.idle_worker = 0.0

    def _worker_cpu(self) -> float:
        return self.ctl.cpu_seconds() if self.ctl is not None else self.noop.cpu_seconds()

    async def idle(self, seconds: float) -> None:
        a, w0, t0 = await self.server.read(), self._worker_cpu(), time.monotonic()
        await asyncio.sleep(seconds)
        b, dt = await self.server.read(), time.monotonic() - t0
        self.idle_server = cost_between(a, b).per(dt)
        self.idle_worker = (self._worker_cpu() - w0) / dt

    async def start(self) -> tuple:
        return await self.server.read(), self._worker_cpu(), time.monotonic(), time.time()

    async def stop(self, began: tuple) -> tuple[ServerCost, float]:
        """(server cost, worker CPU seconds) since ``began``, idle subtracted."""
        a, w0, t0, _ = began
        b, dt = await self.server.read(), time.monotonic() - t0
        server = cost_between(a, b).minus(self.idle_server.scaled(dt))
        return server, self._worker_cpu() - w0 - self.idle_worker * dt


async def _register(
    env: BenchEnv, probe: Probe, pool: asyncpg.Pool | None, sims: list[SimAgent], reaper: bool
) -> tuple[ServerCost, float, float]:
    """Send every worker's first beat (64 in flight) and wait until all are registered."""
    client, n = env.client, len(sims)
    tq = probe.ctl.task_queue if probe.ctl is not None else probe.noop.task_queue
    base = 0.0 if reaper else await asyncio.to_thread(probe.noop.handled)
    began = await probe.start()
    await gather_limited(
        (send_heartbeat(client, tq, w.payload(), workflow=None if reaper else NOOP) for w in sims),
        64,
    )
    if pool is not None:

        async def running() -> bool:
            got = await pool.fetchval(
                "SELECT count(*) FROM reaper.workers WHERE state = 'running' AND name = ANY($1)",
                [w.name for w in sims],
            )
            return bool(got >= n)

        await wait_until(running, 300, f"{n} workers running", poll=0.05)
    else:
        await probe.noop.wait_handled(base + n, 300)
    took = time.monotonic() - began[2]
    await asyncio.sleep(1.0)  # what the registration set off (a timer started, an upsert) lands
    server, worker = await probe.stop(began)
    return server.per(n), worker / n, took


async def _steady(
    env: BenchEnv, probe: Probe, sims: list[SimAgent], hb: float, seconds: float, reaper: bool
) -> tuple[ServerCost, float, int, float, float]:
    """The workers beat every ``hb`` s; after one interval, a window of ``seconds``.
    Returns (server cost per beat, worker CPU per beat, beats, window start, end (wall))."""
    tq = probe.ctl.task_queue if probe.ctl is not None else probe.noop.task_queue
    fleet = SimFleet(env.client, tq, hb, overlap=True, workflow=None if reaper else NOOP)
    fleet.add(sims, spread=hb)
    fleet.start()
    try:
        await asyncio.sleep(hb + 0.5)
        began = await probe.start()
        sent0 = fleet.sent
        await asyncio.sleep(seconds)
        server, worker = await probe.stop(began)
        beats = fleet.sent - sent0
        end = time.time()
    finally:
        await fleet.stop()
    return server.per(beats), worker / max(beats, 1), beats, began[3], end


async def run(
    env: BenchEnv, timings: dict[str, str], workers: int, sample: int, progress: Progress
) -> list[Metric]:
    """Metrics 8a and 9: the no-op side first, then a controller ``cost`` started with
    ``timings`` (``COST_TIMINGS`` or a scaling of them) for reaper's side."""
    hb = float(timings["REAPER_HEARTBEAT_INTERVAL"].rstrip("s"))
    stall = float(timings["REAPER_STALL_AFTER"].rstrip("s"))
    noop = env.start_noop_worker(f"bench-cost-noop-{int(time.time()) % 100000}")
    await env.wait_noop(noop)
    probe = Probe(env.server(), noop)
    regs: dict[bool, Side] = {}
    beats: dict[bool, Side] = {}
    ctl: Controller | None = None
    pool: asyncpg.Pool | None = None
    try:
        for reaper in (False, True):
            if reaper:
                noop.stop()
                ctl = probe.ctl = await env.start_controller("cost", timings)
                progress(f"controller 'cost' pid {ctl.pid} ({ctl.timings})")
                pool = await asyncpg.create_pool(ctl.db_url, min_size=1, max_size=2)
            await asyncio.sleep(1.0)
            await probe.idle(2 * hb)
            side = "reaper" if reaper else "no-op"
            sims = [SimAgent(f"cost-{'r' if reaper else 'n'}-{i:04d}") for i in range(workers)]
            server, cpu, took = await _register(env, probe, pool, sims, reaper)
            progress(f"  cost: {workers} {side} registrations in {took:.1f} s")
            ids = [liveness_id(w.name) if reaper else f"{NOOP}-{w.name}" for w in sims[:sample]]
            # Steady beats over one STALL_AFTER: a deadline timer's cycle included.
            b_server, b_cpu, n, t0, t1 = await _steady(env, probe, sims, hb, stall, reaper)
            progress(f"  cost: {n} {side} beats in a window of {t1 - t0:.1f} s")
            born = await anatomy.registration(env.client, ids)
            regs[reaper] = Side(workers, server, born, cpu, took)
            steady = await anatomy.window(env.client, ids, t0, t1)
            beats[reaper] = Side(n, b_server, steady, b_cpu, t1 - t0)
        assert ctl is not None
        rss = ctl.rss()
    finally:
        if pool is not None:
            await pool.close()
        if ctl is not None:
            ctl.stop()
    return [_registration_metric(regs, ctl, rss), _beat_metric(beats, hb, stall)]


def _ratios(r: Side, n: Side, events: tuple[float, float]) -> dict[str, tuple[float, float]]:
    return {
        "server CPU": (r.server.cpu * 1000, n.server.cpu * 1000),
        "events": events,
        "RPCs": (r.server.frontend, n.server.frontend),
    }


def _value(pairs: dict[str, tuple[float, float]]) -> tuple[str, bool]:
    parts, ok = [], True
    for what, (a, b) in pairs.items():
        x = a / b if b else float("inf")
        ok = ok and x <= LIMIT
        unit = " ms" if what == "server CPU" else ""
        parts.append(f"{what} {a:.2f}{unit} vs {b:.2f}{unit} = {x:.2f}x")
    return "; ".join(parts), ok


def _server_lines(r: ServerCost, n: ServerCost) -> list[str]:
    return [
        f"frontend RPCs: reaper {r.frontend:.2f} ({r.top('frontend')}); no-op {n.frontend:.2f} "
        f"({n.top('frontend')})",
        f"calls between the server's services: reaper {r.internal:.2f}, no-op {n.internal:.2f}",
        f"persistence operations: reaper {r.db:.2f} ({r.top('persistence', 10)}); no-op "
        f"{n.db:.2f} ({n.top('persistence', 10)})",
        f"visibility operations: reaper {r.top('visibility')}; no-op {n.top('visibility')}",
        f"billable actions (the server's `action` counter): reaper {r.action_count:.2f} "
        f"({r.top('actions')}); no-op {n.action_count:.2f} ({n.top('actions')})",
    ]


def _registration_metric(regs: dict[bool, Side], ctl: Controller, rss: int) -> Metric:
    r, n = regs[True], regs[False]
    ev_r = r.events.count / max(r.events.beats, 1)
    ev_n = n.events.count / max(n.events.beats, 1)
    value, ok = _value(_ratios(r, n, (ev_r, ev_n)))
    details = [
        f"{r.n} new workers by a first beat each (64 in flight), until `running` in "
        f"reaper.workers: {r.seconds:.1f} s ({r.n / r.seconds:.0f}/s); {n.n} new BenchNoop "
        f"ids by signal-with-start until each signal was handled: {n.seconds:.1f} s "
        f"({n.n / n.seconds:.0f}/s); controller timings {ctl.timings}; idle rates subtracted",
        f"history of one registration, reaper ({ev_r:.0f} events, "
        f"{fmt_bytes(r.events.bytes / max(r.events.beats, 1))}): "
        + anatomy.compact(r.events.sequence),
        f"history of one registration, no-op ({ev_n:.0f} events, "
        f"{fmt_bytes(n.events.bytes / max(n.events.beats, 1))}): "
        + anatomy.compact(n.events.sequence),
        *_server_lines(r.server, n.server),
        f"worker process CPU per registration: controller {r.worker_cpu * 1000:.1f} ms, "
        f"no-op worker {n.worker_cpu * 1000:.1f} ms; controller RSS {fmt_bytes(rss)} with "
        f"{r.n} workers",
    ]
    return Metric("8a", value, f"<= {LIMIT}x each", verdict(ok), details)


def _beat_metric(beats: dict[bool, Side], hb: float, stall: float) -> Metric:
    r, n = beats[True], beats[False]
    value, ok = _value(_ratios(r, n, (r.events_per, n.events_per)))
    per_r = r.events.per(r.events.beats)
    per_n = n.events.per(n.events.beats)
    shown = sorted(set(per_r) | set(per_n), key=lambda k: -per_r.get(k, 0))
    details = [
        f"{r.n} reaper beats and {n.n} no-op signals in windows of one STALL_AFTER "
        f"({stall:g} s), every worker beating every {hb:g} s (liveness only); idle rates "
        "subtracted",
        "history events per beat (reaper / no-op): "
        + ", ".join(f"{k} {per_r.get(k, 0):.2f}/{per_n.get(k, 0):.2f}" for k in shown),
        f"history bytes per beat: reaper {fmt_bytes(r.events.bytes / max(r.events.beats, 1))}, "
        f"no-op {fmt_bytes(n.events.bytes / max(n.events.beats, 1))}",
        f"one liveness's events in the window: {anatomy.compact(r.events.sequence)}",
        *_server_lines(r.server, n.server),
        f"worker process CPU per beat: controller {r.worker_cpu * 1000:.2f} ms, no-op worker "
        f"{n.worker_cpu * 1000:.2f} ms",
    ]
    return Metric("9", value, f"<= {LIMIT}x each", verdict(ok), details)
