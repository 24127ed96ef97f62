"""Metric 4: with a fleet heartbeating, kill 10 workers at once; time from each one's last
heartbeat to ``lost`` and to its replacement placed, against ``LOST_AFTER``; then again with
a CPU-heavy process beside the stack (4d, 4e).

One asyncio process simulates the fleet (reaper/kit/fleet.py): every worker beats by
signal-with-start every ``REAPER_HEARTBEAT_INTERVAL``, the first beats spread over one
interval, workers added in batches until all are registered, then ``LOST_AFTER`` of steady
state (the registration burst's backlog drained: 8b measures registration). Each victim
holds one running task of service ``bench-svc`` (desired count = victims) and reports it in
every beat (a complete report); the other workers send liveness-only beats, so that the
fleet is 1,000 livenesses and not 2,000 workflows (a reporting worker also has a collector;
the cost of reports is metric 1's). Then the victims' beats stop at once. "Last heartbeat"
is the wall-clock time at which Temporal accepted the victim's last beat; ``lost`` is the
time of its ``events`` row ``state`` (``... -> lost``), the replacement the ``created_at``
of the task whose ``replaces`` is the victim's task (same transaction as its ``replaced``
event). Every healthy worker that went ``stalled`` meanwhile is counted. Where the time went
is read from the histories: how long workflow tasks waited in the task queue and ran on the
controller, and the slowest victim's events one by one (bench/loss.py).

Beside each kill, one no-op workflow per victim sleeps ``LOST_AFTER`` on the same server
(bench/noop.py): the floor a judgement after ``LOST_AFTER`` is compared with. 4c gives the
p99 and the maximum of the healthy livenesses' workflow-task waits in the queue (the
backlog, not only the mean). The second kill (4d, 4e) runs with ``python -c "while True:
pass"`` beside the stack (one core of the machine's two busy), on other victims of the same
fleet.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid

import asyncpg

from bench.common import Progress, wait_until
from bench.env import BenchEnv, Controller
from bench.floor import cpu_hog, watch_floors, watch_text, worst_watch
from bench.history import quantile, spread
from bench.loss import Loss, kill_and_judge
from bench.result import Metric, verdict
from reaper.kit.agents import SimAgent
from reaper.kit.fleet import SimFleet


async def ramp(
    fleet: SimFleet,
    pool: asyncpg.Pool,
    workers: list[SimAgent],
    batch: int,
    progress: Progress,
    label: str,
    timeout: float = 900,
) -> float:
    """Add ``workers`` to a beating fleet ``batch`` at a time, each batch once the previous
    one is registered (``running`` in ``reaper.workers``); seconds taken."""
    start = time.monotonic()
    base = await pool.fetchval("SELECT count(*) FROM reaper.workers WHERE state = 'running'")
    for i in range(0, len(workers), batch):
        part = workers[i : i + batch]
        fleet.add(part, spread=min(fleet.interval, 2.0))
        want = base + i + len(part)

        async def check(want: int = want) -> bool:
            n = await pool.fetchval("SELECT count(*) FROM reaper.workers WHERE state = 'running'")
            return n >= want

        await wait_until(
            check, timeout - (time.monotonic() - start), f"{want} workers running", poll=0.25
        )
        if (i // batch) % 5 == 4 or i + batch >= len(workers):
            progress(
                f"  {label}: {want - base} workers running after {time.monotonic() - start:.0f} s"
            )
    return time.monotonic() - start


async def run(
    env: BenchEnv,
    ctl: Controller,
    workers: int,
    victims: int,
    lost_after: float,
    interval: float,
    progress: Progress,
    hog: bool = True,
) -> tuple[list[Metric], dict[str, str]]:
    """4a, 4b and 4c; with ``hog``, 4d and 4e too (a second kill, a CPU hog beside)."""
    client = env.client
    noop = env.start_noop_worker(f"bench-sleep-{uuid.uuid4().hex[:6]}", lost_after)
    await env.wait_noop(noop)
    give_up = lost_after + min(60.0, 3 * lost_after)
    floors = await watch_floors(env, noop, workers, victims, interval, give_up, hog, progress)
    pool = await asyncpg.create_pool(ctl.db_url, min_size=1, max_size=2)
    fleet = SimFleet(client, ctl.task_queue, interval, overlap=True)
    names = [f"fleet-{i:05d}" for i in range(workers)]
    # Placement prefers low names: the victims are the highest, replacements go elsewhere.
    groups = [names[-victims:]] + ([names[-2 * victims : -victims]] if hog else [])
    services = ["bench-svc", "bench-svc-hog"]
    tasks = [{n: f"{services[g]}-{n}" for n in group} for g, group in enumerate(groups)]
    loads: list[tuple[Loss, str]] = []
    try:
        for g in range(len(groups)):
            await pool.execute(
                "INSERT INTO reaper.services (name, desired_count) VALUES ($1, $2)",
                services[g],
                victims,
            )
            await pool.executemany(
                "INSERT INTO reaper.tasks (id, service, worker, state) VALUES ($1, $2, $3,"
                " 'running')",
                [(t, services[g], n) for n, t in tasks[g].items()],
            )
        held = {n: t for group in tasks for n, t in group.items()}
        sims = [
            SimAgent(
                n,
                lists={"containers": [], "volumes": [], "tasks": [held[n]]} if n in held else None,
            )
            for n in names
        ]
        fleet.start()
        took = await ramp(fleet, pool, sims, 100, progress, "fleet")
        # Steady state: a registration burst leaves a backlog in the task queue (waits of up
        # to 18 s at the end of a 1,000-worker ramp, the first re-arms and refreshes in step),
        # which is 8b's subject, not a steady fleet's. The kill comes LOST_AFTER after the
        # last registration, once every worker's first deadline cycle has passed.
        await asyncio.sleep(lost_after)
        healthy = [n for n in names if n not in held]
        sample = healthy[:: max(1, len(healthy) // 200)]
        loss = await kill_and_judge(
            client, ctl, pool, fleet, noop, sample, tasks[0], lost_after, "alone"
        )
        loss.watch = floors[0]
        loads.append((loss, ""))
        progress(f"  fleet: first kill judged (lost max {max(loss.to_lost, default=0):.2f} s)")
        if hog:
            with cpu_hog(env):
                await asyncio.sleep(interval)
                loss = await kill_and_judge(
                    client, ctl, pool, fleet, noop, sample, tasks[1], lost_after, "hog"
                )
            loss.watch = floors[1]
            loads.append((loss, "with a CPU hog beside"))
    finally:
        await fleet.stop()
        await pool.close()
        noop.stop()
    head = (
        f"{workers} workers beating every {interval:g}s ({fleet.sent} beats sent, "
        f"{fleet.errors} failed, load generator at most {fleet.max_lateness:.2f} s late); "
        f"ramp-up {took:.0f} s; {victims} killed at once"
    )
    out: list[Metric] = []
    keys = [("4a", "4b"), ("4d", "4e")]
    for (loss, label), (k_lost, k_repl) in zip(loads, keys, strict=False):
        out += _metrics(loss, k_lost, k_repl, head, label)
    out.append(_waits(loads))
    return out, {"bystander": names[0]}


def _waits(loads: list[tuple[Loss, str]]) -> Metric:
    parts, details = [], []
    for loss, label in loads:
        parts.append(
            f"p99 {quantile(loss.waits, 0.99):.2f} s, max {max(loss.waits, default=0):.2f} s"
            + (f" {label}" if label else "")
        )
        p99, count = loss.sdk_p99
        details.append(
            f"{label or 'alone'}: workflow tasks of {loss.sampled} healthy livenesses, from the "
            f"kill until the last replacement, waited {spread(loss.waits)} in the task queue "
            f"({len(loss.waits)} tasks, from their histories); the controller's SDK "
            f"histogram ({SDK_NOTE}): p99 <= {p99:.2f} s, max <= {loss.sdk_max:.2f} s over "
            f"{count:,} workflow tasks"
        )
    return Metric("4c", "; ".join(parts), "(reported)", "INFO", details)


SDK_NOTE = "temporal_workflow_task_schedule_to_start_latency, every workflow task it ran"


def _metrics(loss: Loss, k_lost: str, k_repl: str, head: str, label: str) -> list[Metric]:
    lost_after, victims, give_up = loss.lost_after, len(loss.victims), loss.give_up
    ctl_cores, tmp_cores, gen_cores, load = loss.cores
    floor = (
        f"no-op timer of LOST_AFTER: {spread(loss.sleepers)} late"
        if loss.sleepers
        else "no-op timer: none closed"
    )
    common = [
        head + (f"; {label}" if label else ""),
        f"healthy workers wrongly stalled: {loss.false_stalls} ({loss.stalled_before} "
        "before the kill)",
        f"from the kill until the last replacement: controller process {ctl_cores:.2f} CPU "
        f"cores, dev server {tmp_cores:.2f}, load generator {gen_cores:.2f}, machine load "
        f"average {load:.1f} on {os.cpu_count()} cores; workflow tasks of {loss.sampled} "
        f"healthy workers' livenesses waited {spread(loss.waits)} in the task queue and took "
        f"{spread(loss.runs)} from start to completion on the controller "
        f"({len(loss.runs)} tasks)",
        f"the floor: {len(loss.sleepers)} BenchSleeper workflows (unsandboxed, a worker of "
        f"their own) started at the kill, each sleeping LOST_AFTER, closed {floor}",
        f"the floor under this load: {len(loss.victims)} of the same number of BenchWatch "
        "workflows (the cheapest liveness: each beat restarts one timer of LOST_AFTER; no "
        "rule, row or reap; unsandboxed, the no-op worker), beaten the same way before "
        f"reaper's fleet and killed at once, closed {watch_text(loss)}",
        f"outage grace (a deadline judged more than HEARTBEAT_INTERVAL late extends LOST_AFTER "
        f"by STALL_AFTER; controller log): {loss.graces[0]} times for {loss.graces[1]} of the "
        f"victims, {loss.graces[2]} times for others",
        f"the victims' workflow tasks (deadline timers, state records, reap): waited "
        f"{spread(loss.vwaits)}, ran {spread(loss.vruns)}; their deadline timers fired "
        f"{spread(loss.vlate)} after due on the server",
    ]
    limits = {k_lost: lost_after + 1.0, k_repl: lost_after + 2.0}
    lost_m = Metric(
        k_lost,
        _value(loss.to_lost, victims, lost_after, give_up, "lost"),
        f"<= {limits[k_lost]:g} s",
        verdict(len(loss.to_lost) == victims and max(loss.to_lost) <= limits[k_lost]),
        [
            *common,
            "per victim, last beat -> lost committed: "
            + ", ".join(f"{x:.2f}" for x in sorted(loss.to_lost)),
            "controller's own view (workers.state_since - last_heartbeat_at): "
            + ", ".join(f"{x:.2f}" for x in loss.ctl_view),
        ],
    )
    repl_m = Metric(
        k_repl,
        _value(loss.to_repl, victims, lost_after, give_up, "replaced"),
        f"<= {limits[k_repl]:g} s",
        verdict(len(loss.to_repl) == victims and max(loss.to_repl) <= limits[k_repl]),
        [
            "per victim, last beat -> replacement placed: "
            + ", ".join(f"{x:.2f}" for x in sorted(loss.to_repl)),
            f"slowest victim {loss.slow}, seconds after its last beat (server event times):",
        ]
        + [f"  {p}" for p in loss.paths],
    )
    for m, xs in ((lost_m, loss.to_lost), (repl_m, loss.to_repl)):
        if m.verdict == "MISS":
            worst_s = (
                f"{max(xs) - lost_after:.2f} s"
                if len(xs) == victims
                else f"more than {give_up - lost_after:.0f} s"
            )
            m.why = (
                f"worst {worst_s} past LOST_AFTER (a no-op timer of LOST_AFTER: at most "
                f"{max(loss.sleepers, default=0):.2f} s; a no-op liveness under the same "
                f"load: {worst_watch(loss)}), with the controller "
                f"at {ctl_cores:.2f} cores and the dev server at {tmp_cores:.2f} on a "
                f"machine at load {load:.1f}: the victims' deadline timers fired up to "
                f"{max(loss.vlate, default=0):.2f} s late on the server; their workflow tasks "
                f"waited up to {max(loss.vwaits, default=0):.2f} s in the task queue and ran up "
                f"to {max(loss.vruns, default=0):.2f} s; the outage grace was granted "
                f"{loss.graces[0]} times to {loss.graces[1]} victims; after the lost timer, "
                "the WorkerReap child's first task follows in sequence (at peer version 1.0, "
                "without in-task-loss, also the record_worker_state and reap_worker "
                "activities and a task between them; the slowest victim's events are listed)"
            )
    return [lost_m, repl_m]


def _value(xs: list[float], victims: int, lost_after: float, give_up: float, what: str) -> str:
    text = f"median {statistics.median(xs):.2f} s, max {max(xs):.2f} s" if xs else "none"
    if len(xs) < victims:
        text += f"; {victims - len(xs)} of {victims} not {what} {give_up:.0f} s after the kill"
    return text + f" (LOST_AFTER {lost_after:g} s)"
