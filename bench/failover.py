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
fleet. The lines, each beside its floor, and their targets are bench/failover_report.py's.

The fleet is served by one controller process or, with ``python -m bench
--fleet-controllers N``, by N on one task queue and one database (replicas, as ``reaper
run`` starts them on a host with the cores: ``REAPER_CONTROLLERS``); their CPU is summed,
their SDK histograms merged and all their logs read.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg

from bench.common import Progress, wait_until
from bench.env import BenchEnv, Controller
from bench.failover_report import loss_metrics, queue_waits
from bench.floor import cpu_hog, watch_floors
from bench.loss import Loss, kill_and_judge
from bench.result import Metric
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


async def start_controllers(env: BenchEnv, count: int, timings: dict[str, str]) -> list[Controller]:
    """``count`` controller processes for the fleet, on one task queue and one database
    (``fleet``, then its replicas ``fleet-2`` ...; each with metrics ports and a log of its
    own); returned once every one polls the task queue."""
    first = await env.start_controller("fleet", timings)
    rest = [
        await env.start_controller(f"fleet-{i}", timings, replica_of=first)
        for i in range(2, count + 1)
    ]
    return [first, *rest]


async def run(
    env: BenchEnv,
    ctls: list[Controller],
    workers: int,
    victims: int,
    lost_after: float,
    interval: float,
    progress: Progress,
    hog: bool = True,
) -> tuple[list[Metric], dict[str, str]]:
    """4a, 4b and 4c; with ``hog``, 4d and 4e too (a second kill, a CPU hog beside).
    ``ctls`` are the controller processes serving the fleet (:func:`start_controllers`)."""
    client, ctl = env.client, ctls[0]
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
            client, ctls, pool, fleet, noop, sample, tasks[0], lost_after, "alone"
        )
        loss.watch = floors[0]
        loads.append((loss, ""))
        progress(f"  fleet: first kill judged (lost max {max(loss.to_lost, default=0):.2f} s)")
        if hog:
            with cpu_hog(env):
                await asyncio.sleep(interval)
                loss = await kill_and_judge(
                    client, ctls, pool, fleet, noop, sample, tasks[1], lost_after, "hog"
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
        f"ramp-up {took:.0f} s; {victims} killed at once; {len(ctls)} controller "
        f"process{'es' if len(ctls) > 1 else ''} on one task queue"
    )
    out: list[Metric] = []
    # 4a/4b against LOST_AFTER (issue 20); 4d/4e, with the hog, against the floor (issue 36).
    keys = [("4a", "4b", False), ("4d", "4e", True)]
    for (loss, label), (k_lost, k_repl, of_floor) in zip(loads, keys, strict=False):
        out += loss_metrics(loss, k_lost, k_repl, head, label, of_floor)
    out.append(queue_waits(loads))
    return out, {"bystander": names[0]}
