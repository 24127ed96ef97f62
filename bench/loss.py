"""One kill of metric 4: workers' beats stop at once; each one's last heartbeat to ``lost``
and to its replacement, beside the timer of a no-op workflow that sleeps ``LOST_AFTER``.

At the kill, ``BenchSleeper`` workflows (bench/noop.py, unsandboxed, in a worker of their
own) are started on the same dev server, one per victim, each sleeping ``LOST_AFTER``: from
Temporal's acceptance of the start to the workflow's close is what a judgement after
``LOST_AFTER`` costs at the least on this server, under this load (a timer, a workflow
task). Before the reaper fleet beats, the same fleet of ``BenchWatch`` workflows (the
cheapest liveness: every beat restarts a timer of ``LOST_AFTER``; no rule, no row, no reap)
beats the no-op worker and loses the same number of workers at once (bench/floor.py): from
each one's last beat to its close is what a loss costs at the least under a fleet's load on
this machine. Where the time went is read from the histories (workflow-task waits in the
task queue, run times, timer lateness) and from the controller's SDK metrics
(``temporal_workflow_task_schedule_to_start_latency``, every workflow task it ran).
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import asyncpg
import psutil
from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client

from bench.common import wait_until
from bench.env import Controller, NoopWorker
from bench.history import quantile, task_latencies, timeline, timer_lateness
from bench.server import cpu, temporal_processes
from reaper.kit.fleet import SimFleet
from workflows.common import liveness_id

SDK_WAIT = "temporal_workflow_task_schedule_to_start_latency"


def sdk_buckets(*ctls: Controller) -> Counter[float]:
    """Cumulative bucket counts of the controllers' workflow-task schedule-to-start latency
    (milliseconds, summed over task queues, workflow types and the controllers given: the
    buckets are the SDK's, the same in every process, so the sum is the histogram of every
    workflow task any of them ran)."""
    out: Counter[float] = Counter()
    for ctl in ctls:
        url = f"http://127.0.0.1:{ctl.sdk_metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == f"{SDK_WAIT}_bucket":
                    out[float(s.labels["le"])] += int(s.value)
    return out


def bucket_quantile(a: Counter[float], b: Counter[float], q: float) -> tuple[float, int]:
    """The upper bound (seconds) of the bucket holding the ``q`` quantile of the tasks
    counted between readings ``a`` and ``b``, and their number."""
    bounds = sorted(b)
    counts = [b[le] - a.get(le, 0) for le in bounds]
    total = int(counts[-1]) if counts else 0
    for le, c in zip(bounds, counts, strict=True):
        if total and c >= q * total:
            return le / 1000.0, total
    return float("inf"), total


@dataclass
class Loss:
    """What one kill measured; seconds unless named otherwise."""

    victims: list[str]
    lost_after: float
    give_up: float
    to_lost: list[float] = field(default_factory=list)
    to_repl: list[float] = field(default_factory=list)
    sleepers: list[float] = field(default_factory=list)
    """Each no-op sleeper's close after its start was accepted, less ``LOST_AFTER``."""
    watch: list[float] = field(default_factory=list)
    """Each ``BenchWatch`` victim's close after its last beat (the floor under load)."""
    cores: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    """Controllers (their sum), dev server, load generator (CPU cores), machine load
    average."""
    ctl_cores: list[float] = field(default_factory=list)
    """Each controller process's CPU cores (``cores[0]`` is their sum)."""
    waits: list[float] = field(default_factory=list)
    runs: list[float] = field(default_factory=list)
    vwaits: list[float] = field(default_factory=list)
    vruns: list[float] = field(default_factory=list)
    vlate: list[float] = field(default_factory=list)
    sdk_p99: tuple[float, int] = (0.0, 0)
    sdk_max: float = 0.0
    sampled: int = 0
    false_stalls: int = 0
    stalled_before: int = 0
    ctl_view: list[float] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    slow: str = ""
    graces: tuple[int, int, int] = (0, 0, 0)


async def _sleepers(
    client: Client, noop: NoopWorker, n: int, seconds: float, tag: str
) -> list[tuple[str, float]]:
    async def one(i: int) -> tuple[str, float]:
        wid = f"sleeper-{tag}-{i}"
        await client.start_workflow("BenchSleeper", seconds, id=wid, task_queue=noop.task_queue)
        return wid, time.time()

    return await asyncio.gather(*(one(i) for i in range(n)))


async def kill_and_judge(
    client: Client,
    ctls: Sequence[Controller],
    pool: asyncpg.Pool,
    fleet: SimFleet,
    noop: NoopWorker,
    healthy: list[str],
    tasks: dict[str, str],
    lost_after: float,
    tag: str,
) -> Loss:
    """Stop the beats of ``tasks``' workers (victim -> its task) at once and measure;
    ``ctls`` are every controller process serving the fleet (one task queue, one database):
    their CPU is summed, their SDK histograms merged, their logs read."""
    doomed = list(tasks)
    loss = Loss(doomed, lost_after, lost_after + min(60.0, 3 * lost_after))
    dead = [n for n, w in fleet.agents.items() if not w.alive or n in tasks]
    loss.stalled_before = await pool.fetchval(
        "SELECT count(*) FROM reaper.events WHERE action = 'state'"
        " AND reason LIKE '%-> stalled%' AND NOT worker = ANY($1::text[])",
        dead,
    )
    temporal, me = temporal_processes(), [psutil.Process()]
    c0 = [c.cpu_seconds() for c in ctls]
    t0, d0, w0 = cpu(temporal), cpu(me), time.monotonic()
    s0 = await asyncio.to_thread(sdk_buckets, *ctls)
    fleet.kill(doomed)
    killed_at = time.time()
    started = await _sleepers(client, noop, len(doomed), lost_after, tag)

    async def done() -> bool:
        n = await pool.fetchval(
            "SELECT count(*) FROM reaper.tasks WHERE replaces = ANY($1::text[])",
            list(tasks.values()),
        )
        return n >= len(doomed)

    try:
        await wait_until(done, loss.give_up, "replacements placed", poll=0.1)
    except TimeoutError:
        pass  # measured as such: the victims not lost or not replaced by then
    wall = time.monotonic() - w0
    loss.ctl_cores = [(c.cpu_seconds() - c0[i]) / wall for i, c in enumerate(ctls)]
    loss.cores = (
        sum(loss.ctl_cores),
        (cpu(temporal) - t0) / wall,
        (cpu(me) - d0) / wall,
        os.getloadavg()[0],
    )
    s1 = await asyncio.to_thread(sdk_buckets, *ctls)
    loss.sdk_p99 = bucket_quantile(s0, s1, 0.99)
    loss.sdk_max = bucket_quantile(s0, s1, 1.0)[0]
    await asyncio.sleep(0.5)
    last = {n: t for n in doomed if (t := fleet.agents[n].last_sent) is not None}
    lost_rows = await pool.fetch(
        "SELECT worker, min(extract(epoch FROM at)) AS at FROM reaper.events"
        " WHERE action = 'state' AND reason LIKE '%-> lost%' AND worker = ANY($1::text[])"
        " GROUP BY worker",
        doomed,
    )
    repl_rows = await pool.fetch(
        "SELECT t.replaces, extract(epoch FROM t.created_at) AS at FROM reaper.tasks t"
        " WHERE t.replaces = ANY($1::text[])",
        list(tasks.values()),
    )
    by_task = {t: n for n, t in tasks.items()}
    loss.to_lost = [float(r["at"]) - last[r["worker"]] for r in lost_rows]
    replaced = {
        by_task[r["replaces"]]: float(r["at"]) - last[by_task[r["replaces"]]] for r in repl_rows
    }
    loss.to_repl = list(replaced.values())
    loss.false_stalls = await pool.fetchval(
        "SELECT count(*) FROM reaper.events WHERE action = 'state'"
        " AND reason LIKE '%-> stalled%' AND NOT worker = ANY($1::text[])",
        dead,
    )
    loss.ctl_view = [
        float(r["s"])
        for r in await pool.fetch(
            "SELECT extract(epoch FROM state_since - last_heartbeat_at) AS s FROM reaper.workers"
            " WHERE name = ANY($1::text[]) AND state = 'lost'",
            doomed,
        )
    ]
    closed = await closes(client, [wid for wid, _ in started], killed_at + loss.give_up)
    loss.sleepers = [closed[wid] - at - lost_after for wid, at in started if wid in closed]
    sample = [liveness_id(n) for n in healthy]
    loss.sampled = len(sample)
    loss.waits, loss.runs = await task_latencies(client, sample, killed_at)
    ids = [liveness_id(n) for n in doomed]
    loss.vwaits, loss.vruns = await task_latencies(client, ids, killed_at)
    loss.vlate = await timer_lateness(client, ids, killed_at)
    loss.slow = max(doomed, key=lambda n: replaced.get(n, float("inf")))
    s = loss.slow
    loss.paths = [
        await timeline(client, wid, last[s] + 1.0, last[s])
        for wid in (liveness_id(s), f"reap-{s}-1")
    ]
    loss.graces = graces(set(doomed), *ctls)
    return loss


async def closes(client: Client, ids: list[str], until: float) -> dict[str, float]:
    """Each workflow's close time (epoch seconds), polled until all closed or ``until``
    (epoch seconds) passes; those still open are left out."""
    out: dict[str, float] = {}
    while True:
        for wid in ids:
            if wid not in out:
                desc = await client.get_workflow_handle(wid).describe()
                if desc.close_time is not None:
                    out[wid] = desc.close_time.timestamp()
        if len(out) == len(ids) or time.time() >= until:
            return out
        await asyncio.sleep(0.5)


def graces(victims: set[str], *ctls: Controller) -> tuple[int, int, int]:
    """From the controllers' logs: outage graces granted (the liveness warns "deadline
    judged Ns late: grace until T"): (to victims, victims concerned, to others)."""
    to_victims, others, who = 0, 0, set()
    for ctl in ctls:
        if ctl.log_path is None:
            continue
        try:
            text = ctl.log_path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if "late: grace until" not in line:
                continue
            worker = next((v for v in victims if f"{v}:" in line), None)
            if worker is not None:
                to_victims += 1
                who.add(worker)
            else:
                others += 1
    return to_victims, len(who), others


def waits_summary(loss: Loss) -> str:
    """``p99 a s, max b s`` of the healthy livenesses' queue waits, from the histories."""
    return f"p99 {quantile(loss.waits, 0.99):.2f} s, max {max(loss.waits, default=0):.2f} s"
