"""Metric 4: with a fleet heartbeating, kill 10 workers at once; time from each one's last
heartbeat to ``lost`` and to its replacement placed, against ``LOST_AFTER``.

One asyncio process simulates the fleet (reaper/kit/agents.py): every worker beats by
signal-with-start every ``REAPER_HEARTBEAT_INTERVAL``, the first beats spread over one
interval, workers added in batches until all are registered. Each victim holds one running
task of service ``bench-svc`` (desired count = victims) and reports it in every beat
(a complete report); the other workers send liveness-only beats, so that the fleet is 1,000
livenesses and not 2,000 workflows (a reporting worker also has a collector; the cost of
reports is metric 1's). Then the victims' beats stop at once. "Last heartbeat" is the
wall-clock time at which Temporal accepted the victim's last beat; ``lost`` is the time of
its ``events`` row ``state`` (``... -> lost``), the replacement the ``created_at`` of the
task whose ``replaces`` is the victim's task (same transaction as its ``replaced`` event).
Every healthy worker that went ``stalled`` meanwhile is counted. Where the time went is read
from the histories: how long workflow tasks waited in the task queue and ran on the
controller, and the slowest victim's events one by one.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

import asyncpg
import psutil

from bench.common import wait_until
from bench.env import Controller
from bench.history import spread, task_latencies, timeline, timer_lateness
from bench.result import Metric, verdict
from bench.throughput import cpu, temporal_processes
from reaper.kit.agents import SimAgent
from reaper.kit.fleet import SimFleet
from workflows.common import liveness_id


async def ramp(
    fleet: SimFleet,
    pool: asyncpg.Pool,
    workers: list[SimAgent],
    batch: int,
    progress,
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
    client,
    ctl: Controller,
    workers: int,
    victims: int,
    lost_after: float,
    interval: float,
    progress,
) -> tuple[list[Metric], dict]:
    pool = await asyncpg.create_pool(ctl.db_url, min_size=1, max_size=2)
    fleet = SimFleet(client, ctl.task_queue, interval, overlap=True)
    try:
        names = [f"fleet-{i:05d}" for i in range(workers)]
        doomed = names[-victims:]  # placement prefers low names: replacements go elsewhere
        tasks = {n: f"bench-svc-{n}" for n in doomed}
        await pool.execute(
            "INSERT INTO reaper.services (name, desired_count) VALUES ($1, $2)",
            "bench-svc",
            victims,
        )
        await pool.executemany(
            "INSERT INTO reaper.tasks (id, service, worker, state) VALUES ($1, 'bench-svc', $2,"
            " 'running')",
            [(t, n) for n, t in tasks.items()],
        )
        sims = [
            SimAgent(
                n,
                lists={"containers": [], "volumes": [], "tasks": [tasks[n]]}
                if n in tasks
                else None,
            )
            for n in names
        ]
        fleet.start()
        took = await ramp(fleet, pool, sims, 100, progress, "fleet")
        # Steady state for one interval, then the victims' beats stop at once.
        await asyncio.sleep(interval)
        stalled_before = await pool.fetchval(
            "SELECT count(*) FROM reaper.events"
            " WHERE action = 'state' AND reason LIKE '%-> stalled%'"
        )
        temporal = temporal_processes()
        me = [psutil.Process()]
        c0, t0, d0, w0 = ctl.cpu_seconds(), cpu(temporal), cpu(me), time.monotonic()
        fleet.kill(doomed)
        killed_at = time.time()
        rss_1 = ctl.rss()

        async def done() -> bool:
            n = await pool.fetchval(
                "SELECT count(*) FROM reaper.tasks WHERE replaces = ANY($1::text[])",
                list(tasks.values()),
            )
            return n >= victims

        give_up = lost_after + 60
        try:
            await wait_until(done, give_up, "replacements placed", poll=0.1)
        except TimeoutError:
            pass  # measured as such: the victims not lost or not replaced by then
        wall = time.monotonic() - w0
        ctl_cores, tmp_cores = (ctl.cpu_seconds() - c0) / wall, (cpu(temporal) - t0) / wall
        gen_cores, load = (cpu(me) - d0) / wall, os.getloadavg()[0]
        await asyncio.sleep(0.5)
        last = {n: fleet.agents[n].last_sent for n in doomed}
        lost_rows = await pool.fetch(
            "SELECT worker, min(extract(epoch FROM at)) AS at FROM reaper.events"
            " WHERE action = 'state' AND reason LIKE '%-> lost%' AND worker = ANY($1::text[])"
            " GROUP BY worker",
            doomed,
        )
        repl_rows = await pool.fetch(
            "SELECT t.replaces, extract(epoch FROM t.created_at) AS at, t.worker"
            " FROM reaper.tasks t WHERE t.replaces = ANY($1::text[])",
            list(tasks.values()),
        )
        by_task = {t: n for n, t in tasks.items()}
        to_lost = [float(r["at"]) - last[r["worker"]] for r in lost_rows]
        to_repl = [float(r["at"]) - last[by_task[r["replaces"]]] for r in repl_rows]
        false_stalls = await pool.fetchval(
            "SELECT count(*) FROM reaper.events WHERE action = 'state'"
            " AND reason LIKE '%-> stalled%' AND NOT worker = ANY($1::text[])",
            doomed,
        )
        ctl_view = await pool.fetch(
            "SELECT extract(epoch FROM state_since - last_heartbeat_at) AS s FROM reaper.workers"
            " WHERE name = ANY($1::text[]) AND state = 'lost'",
            doomed,
        )
    finally:
        await fleet.stop()
        await pool.close()
    sample = [liveness_id(n) for n in names[: workers - victims : max(1, workers // 20)]]
    waits, runs = await task_latencies(client, sample, killed_at)
    vwaits, vruns = await task_latencies(client, [liveness_id(n) for n in doomed], killed_at)
    vlate = await timer_lateness(client, [liveness_id(n) for n in doomed], killed_at)
    # The slowest victim's path, from the histories: liveness, then its reap child.
    replaced = {
        by_task[r["replaces"]]: float(r["at"]) - last[by_task[r["replaces"]]] for r in repl_rows
    }
    slow = max(doomed, key=lambda n: replaced.get(n, float("inf")))
    paths = [
        await timeline(client, wid, last[slow] + 1.0, last[slow])
        for wid in (liveness_id(slow), f"reap-{slow}-1")
    ]
    graces = _graces(ctl, set(doomed))
    limit = lost_after + 1.0
    common = [
        f"{workers} workers beating every {interval:g}s ({fleet.sent} beats sent, "
        f"{fleet.errors} failed, load generator at most {fleet.max_lateness:.2f} s late); "
        f"ramp-up {took:.0f} s; {victims} killed at once",
        f"healthy workers wrongly stalled: {false_stalls} ({stalled_before} before the kill)",
        f"from the kill until the last replacement: controller process {ctl_cores:.2f} CPU "
        f"cores, dev server {tmp_cores:.2f}, load generator {gen_cores:.2f}, machine load "
        f"average {load:.1f} on {os.cpu_count()} cores; workflow tasks of {len(sample)} healthy "
        f"workers' livenesses waited {spread(waits)} in the task queue and took "
        f"{spread(runs)} from start to completion on the controller ({len(runs)} tasks)",
        f"outage grace (a deadline task that starts more than HEARTBEAT_INTERVAL late is "
        f"taken for an outage and LOST_AFTER extended by STALL_AFTER; controller log): "
        f"{graces[0]} times for {graces[1]} of the victims, {graces[2]} times for healthy "
        f"workers",
        f"the victims' workflow tasks (deadline timers, state records, reap): waited "
        f"{spread(vwaits)}, ran {spread(vruns)}; their deadline timers fired "
        f"{spread(vlate)} after due on the server",
    ]
    lost_m = Metric(
        "4a",
        _value(to_lost, victims, lost_after, give_up, "lost"),
        f"<= {limit:g} s",
        verdict(len(to_lost) == victims and max(to_lost) <= limit),
        [
            *common,
            "per victim, last beat -> lost committed: "
            + ", ".join(f"{x:.2f}" for x in sorted(to_lost)),
            "controller's own view (workers.state_since - last_heartbeat_at): "
            + ", ".join(f"{float(r['s']):.2f}" for r in ctl_view),
        ],
    )
    repl_m = Metric(
        "4b",
        _value(to_repl, victims, lost_after, give_up, "replaced"),
        f"<= {limit:g} s",
        verdict(len(to_repl) == victims and max(to_repl) <= limit),
        [
            "per victim, last beat -> replacement placed: "
            + ", ".join(f"{x:.2f}" for x in sorted(to_repl)),
            f"slowest victim {slow}, seconds after its last beat (server event times):",
        ]
        + [f"  {p}" for p in paths],
    )
    for m, xs in ((lost_m, to_lost), (repl_m, to_repl)):
        if m.verdict == "MISS":
            worst_s = (
                f"{max(xs) - lost_after:.2f} s"
                if len(xs) == victims
                else f"more than {give_up - lost_after:.0f} s"
            )
            m.why = (
                f"worst {worst_s} past LOST_AFTER, with the controller "
                f"at {ctl_cores:.2f} cores and the dev server at {tmp_cores:.2f} on a "
                f"machine at load {load:.1f}: the victims' deadline timers fired up to "
                f"{max(vlate, default=0):.2f} s late on the server; their workflow tasks "
                f"waited up to {max(vwaits, default=0):.2f} s in the task queue and ran up "
                f"to {max(vruns, default=0):.2f} s; the outage grace was granted "
                f"{graces[0]} times to {graces[1]} victims; after the lost timer, "
                "record_worker_state,"
                " fleet_status, the WorkerReap child and its reap_worker activity are "
                "further tasks in sequence (the slowest victim's events are listed)"
            )
    return [lost_m, repl_m], {"rss_at_fleet": rss_1, "killed_at": killed_at, "bystander": names[0]}


def _value(xs: list[float], victims: int, lost_after: float, give_up: float, what: str) -> str:
    text = f"median {statistics.median(xs):.2f} s, max {max(xs):.2f} s" if xs else "none"
    if len(xs) < victims:
        text += f"; {victims - len(xs)} of {victims} not {what} {give_up:.0f} s after the kill"
    return text + f" (LOST_AFTER {lost_after:g} s)"


def _graces(ctl: Controller, victims: set[str]) -> tuple[int, int, int]:
    """From the controller's log: outage graces granted (WorkerLiveness._on_deadline warns
    "deadline of W fired Ns late: grace until T"): (to victims, victims concerned, to others)."""
    try:
        text = ctl.log_path.read_text(errors="replace")
    except OSError:
        return 0, 0, 0
    to_victims, others, who = 0, 0, set()
    for line in text.splitlines():
        if "late: grace until" not in line or "deadline of " not in line:
            continue
        worker = line.split("deadline of ", 1)[1].split(" ", 1)[0]
        if worker in victims:
            to_victims += 1
            who.add(worker)
        else:
            others += 1
    return to_victims, len(who), others
