"""Metric 1: heartbeats handled by ``WorkerLiveness`` per second, against raw signals per second
to a no-op workflow, on the same dev server, measured side by side in the same run.

Both targets get the same load: ``workers`` workflows, ``beats`` heartbeats each, sent by
signal-with-start (as agents do) round-robin with 64 calls in flight, half of them
liveness-only and half carrying an unchanged complete report. A burst is timed from its first
send until every beat is reflected in the workflow's state (``state`` query ``last_seq`` for
reaper, ``last_seq`` for the no-op). The no-op runs in a worker process of its own,
unsandboxed, with the SDK's default Worker settings (bench/noop.py): the cheapest workflow
Python can run, not one carrying reaper's overheads. Rounds alternate no-op, reaper, no-op,
reaper...; the rates compared are all beats of a side over all its rounds' time. Metric 1b
is the same with reports of 50 containers against the no-op given the same payloads.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import psutil
from temporalio.client import Client
from temporalio.service import RPCError

from bench import plain_why
from bench.common import forwarded, gather_limited, query_state, wait_settled, wait_until
from bench.env import BenchEnv, Controller
from bench.plain_client import Burst
from bench.result import Metric, verdict
from bench.server import cpu, temporal_processes
from reaper.core.signing import new_private_key
from reaper.kit.agents import SimAgent, send_heartbeat

NOOP = "BenchNoop"


async def _noop_seq(client: Client, name: str) -> int:
    try:
        return await client.get_workflow_handle(f"{NOOP}-{name}").query("last_seq", result_type=int)
    except RPCError:
        return -1


async def _reaper_seq(client: Client, name: str) -> int:
    try:
        st = await query_state(client, name)
    except RPCError:
        return -1
    return st.last_seq if st.last_seq is not None else -1


async def burst(
    client: Client,
    tq: str,
    sims: list[SimAgent],
    beats: int,
    workflow: str | None,
    reports: bool = True,
) -> float:
    """Send ``beats`` beats per worker, every second one with its (unchanged) complete report
    unless ``reports`` is false; seconds until every one is reflected."""
    order = [(b, w) for b in range(beats) for w in sims]
    seq_of = _noop_seq if workflow else _reaper_seq
    start = time.monotonic()
    await gather_limited(
        (
            send_heartbeat(
                client, tq, w.payload(with_lists=reports and b % 2 == 1), workflow=workflow
            )
            for b, w in order
        ),
        64,
    )
    want = {w.name: w.seq - 1 for w in sims}

    async def check() -> bool:
        names = list(want)
        seqs = await gather_limited((seq_of(client, n) for n in names), 32)
        for n, s in zip(names, seqs, strict=True):
            if s >= want[n]:
                want.pop(n)
        return not want

    await wait_until(check, 300, "beats reflected", poll=0.02)
    return time.monotonic() - start


def _sims(prefix: str, workers: int, signed: bool = False, handles: int = 5) -> list[SimAgent]:
    return [
        SimAgent(
            f"{prefix}-{i:04d}",
            lists={
                "containers": [f"{prefix}-{i:04d}-c{j}" for j in range(handles)],
                "volumes": [],
                "tasks": [],
            },
            key=new_private_key() if signed else None,
        )
        for i in range(workers)
    ]


async def run(
    env: BenchEnv, ctl: Controller, workers: int, beats: int, rounds: int
) -> list[Metric]:
    """Metric 1 (reaper against the no-op), 1b (the same with 50-handle reports) and 1s
    (signed beats against unsigned ones, issue 9); in each round the no-op, then unsigned
    and signed in turns, then the 50-handle no-op and reaper."""
    client = env.client
    noop_w = env.start_noop_worker(f"bench-noop-{uuid.uuid4().hex[:6]}")
    await env.wait_noop(noop_w)
    noop_tq = noop_w.task_queue
    noop_ps = psutil.Process(noop_w.pid)
    temporal = temporal_processes()

    live, noop = _sims("tput", workers), _sims("noop", workers)
    signed = _sims("sign", workers, signed=True)
    live50, noop50 = _sims("t50", workers, handles=50), _sims("n50", workers, handles=50)
    pool = await asyncpg.create_pool(ctl.db_url, min_size=1, max_size=1)
    try:
        await pool.copy_records_to_table(
            "containers",
            schema_name="reaper",
            columns=["handle", "worker", "state"],
            records=[
                (h, w.name, "created")
                for w in live + signed + live50
                for h in (w.lists or {})["containers"]
            ],
        )
    finally:
        await pool.close()
    # Warm-up: every workflow started, every first report reconciled, every key pinned; and
    # the scheduler's inserts above fed back once (the change feed) before timing starts.
    for sims in (live, signed, live50):
        await gather_limited(
            (send_heartbeat(client, ctl.task_queue, w.payload()) for w in sims), 64
        )
    await gather_limited(
        (send_heartbeat(client, noop_tq, w.payload(), workflow=NOOP) for w in noop + noop50), 64
    )
    every = live + signed + live50
    await wait_settled(client, {w.name: w.seq - 1 for w in every}, timeout=180)
    await wait_until(lambda: _all_noop(client, noop + noop50), 120, "no-op workflows started")
    await asyncio.sleep(2 * ctl.heartbeat_interval)  # the feed's nudges delivered
    for sims in (live, signed, live50):
        await gather_limited(
            (send_heartbeat(client, ctl.task_queue, w.payload()) for w in sims), 64
        )
    await wait_settled(client, {w.name: w.seq - 1 for w in every}, timeout=180)
    fwd0 = await forwarded(client, [w.name for w in live])

    n = workers * beats
    noop_s, reaper_s, signed_s, noop50_s, live50_s = [], [], [], [], []
    cpu_ctl = cpu_noop = cpu_tmp_r = cpu_tmp_n = 0.0
    for r in range(rounds):
        c0, t0 = noop_ps.cpu_times(), cpu(temporal)
        noop_s.append(await burst(client, noop_tq, noop, beats, NOOP))
        c1, t1 = noop_ps.cpu_times(), cpu(temporal)
        cpu_noop += (c1.user + c1.system) - (c0.user + c0.system)
        cpu_tmp_n += t1 - t0
        for side in ("unsigned", "signed") if r % 2 == 0 else ("signed", "unsigned"):
            if side == "signed":
                signed_s.append(await burst(client, ctl.task_queue, signed, beats, None))
                continue
            k0, t0 = ctl.cpu_seconds(), cpu(temporal)
            reaper_s.append(await burst(client, ctl.task_queue, live, beats, None))
            cpu_ctl += ctl.cpu_seconds() - k0
            cpu_tmp_r += cpu(temporal) - t0
        await asyncio.sleep(0.5)
        noop50_s.append(await burst(client, noop_tq, noop50, beats, NOOP))
        live50_s.append(await burst(client, ctl.task_queue, live50, beats, None))
        await asyncio.sleep(0.5)
    await wait_settled(client, {w.name: w.seq - 1 for w in live + live50}, timeout=180)
    reconciled = await forwarded(client, [w.name for w in live]) - fwd0
    # The same beats without any report: what the liveness alone costs.
    bare = await burst(client, ctl.task_queue, live, beats, None, reports=False)
    # The same beats from a plain client (bench/plain_client.py), for both sides: issue 36.
    plain5, plain50 = [
        await plain_why.beside(client, ctl, noop_w, workers, beats, h) for h in (5, 50)
    ]
    noop_rate = n * rounds / sum(noop_s)
    reaper_rate = n * rounds / sum(reaper_s)
    signed_rate = n * rounds / sum(signed_s)
    ratio = reaper_rate / noop_rate
    total = n * rounds
    unchanged = workers * (beats // 2) * rounds
    details = [
        f"{workers} workflows x {beats} beats = {n} per round, {rounds} rounds each, "
        f"alternating; half liveness-only, half an unchanged report of 5 containers; the "
        "no-op unsandboxed with the SDK's default Worker settings (bench/noop.py; before "
        "issue 20 it ran sandboxed with the controller's settings)",
        "no-op rounds: " + ", ".join(f"{n / s:.0f}" for s in noop_s) + " signals/s; "
        "reaper rounds: " + ", ".join(f"{n / s:.0f}" for s in reaper_s) + " beats/s",
        f"CPU per beat: controller {cpu_ctl / total * 1000:.2f} ms vs no-op worker "
        f"{cpu_noop / total * 1000:.2f} ms; dev server {cpu_tmp_r / total * 1000:.2f} ms "
        f"(reaper) vs {cpu_tmp_n / total * 1000:.2f} ms (no-op)",
        f"{reconciled} kind-reports of {unchanged} unchanged reports were diffed against "
        f"Postgres during the reaper rounds (controller: {ctl.timings}; no row changed, so only "
        "the FULL_RESYNC_INTERVAL safety net diffs)",
        f"reaper with liveness-only beats (no report at all): {n / bare:.0f} beats/s = "
        f"{n / bare / noop_rate:.2f} of the no-op",
        f"plain client (bench/plain_client.py, {plain5.case.label()}, once per side "
        f"on new ids): {plain5.summary()}; lower than the rounds: {plain_why.WHY}",
    ]
    m = Metric(
        "1",
        f"{reaper_rate:.0f} vs {noop_rate:.0f} signals/s = {ratio:.2f}; plain client "
        f"{plain5.rate(0, _handled) / plain5.rate(1, _handled):.2f}",
        ">= 0.8",
        verdict(ratio >= 0.8),
        details,
    )
    if ratio < 0.8:
        m.why = (
            f"liveness-only beats reach {n / bare / noop_rate:.2f} of the no-op; "
            f"{reconciled} kind-reports diffed; controller CPU "
            f"{cpu_ctl / total * 1000:.2f} ms per beat against {cpu_noop / total * 1000:.2f}"
            f" ms, dev server {cpu_tmp_r / total * 1000:.2f} ms against "
            f"{cpu_tmp_n / total * 1000:.2f} ms, on 2 shared cores"
        )
    r50 = (n * rounds / sum(live50_s)) / (n * rounds / sum(noop50_s))
    m50 = Metric(
        "1b",
        f"{n * rounds / sum(live50_s):.0f} vs {n * rounds / sum(noop50_s):.0f} signals/s "
        f"= {r50:.2f}; plain client {plain50.rate(0, _handled) / plain50.rate(1, _handled):.2f}",
        ">= 0.8",
        verdict(r50 >= 0.8),
        [
            "metric 1's beats with an unchanged report of 50 containers every other beat, "
            "the no-op given the same payloads; run after metric 1's rounds in each round",
            "no-op rounds: " + ", ".join(f"{n / x:.0f}" for x in noop50_s) + " signals/s; "
            "reaper rounds: " + ", ".join(f"{n / x:.0f}" for x in live50_s) + " beats/s",
            f"plain client, every beat an unchanged report of 50 containers: {plain50.summary()}",
        ],
    )
    sig_ratio = signed_rate / reaper_rate
    s = Metric(
        "1s",
        f"{signed_rate:.0f} vs {reaper_rate:.0f} beats/s = {sig_ratio:.2f}",
        ">= 0.9",
        verdict(sig_ratio >= 0.9),
        [
            "the same beats, each signed by its agent's Ed25519 key (pinned in the warm-up) and "
            "verified by the liveness (CONTRACT.md §5.2, REAPER_AGENT_AUTH=pin); in each round "
            "after the no-op's, unsigned and signed take turns going first",
            "signed rounds: " + ", ".join(f"{n / x:.0f}" for x in signed_s) + " beats/s",
        ],
    )
    return [m, m50, s]


def _handled(b: Burst) -> float:
    return b.handled_s


async def _all_noop(client: Client, sims: list[SimAgent]) -> bool:
    seqs = await gather_limited((_noop_seq(client, w.name) for w in sims), 32)
    return all(s >= 0 for s in seqs)
