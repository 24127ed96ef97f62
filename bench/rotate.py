"""Metric 10: rotating a host (CONTRACT.md §6, issue 34's "Speed" row). A worker holding 50
tasks of 5 services (10 each) is drained with ``migrate`` against 10 other workers: from the
``drain`` update's answer to the worker's ``drained`` events row, beside the floor; once with
``max_surge`` 1 (10a: ten waves of one task per service) and once with 5 (10b: two waves).

Each wave of a migration is: the fleet monitor's upkeep places one replacement per service
with surge left, on the least loaded worker, and nudges its liveness, which reconciles the
tasks report it holds at once; the worker's agent reads ``state`` after its next beat,
starts what is assigned and reports it in the beat after; the report is reconciled (the
replacement ``running``) and wakes the upkeep, which stops the originals whose replacement
runs and places the next wave. Once the worker holds nothing, it is ``drained``.

The floor is the cheapest way the same work can be done: the agents themselves, with no
controller. Before reaper's controller starts, the same 10 target agents beat ``BenchNoop``
workflows (bench/noop.py) at the same interval; a driver in this process plays a perfect
scheduler: it hands each service's next ``max_surge`` tasks straight to the least loaded
agents' lists and, as soon as an agent's beat carrying a task is accepted by Temporal,
counts it running and hands on the next. From the first hand-out to the last task reported
is what the agents take to report the replacements running. Target: reaper within the floor
plus ``2 x HEARTBEAT_INTERVAL`` per wave (one upkeep to place and one to stop, each up to an
interval away). The floor's driver and the waves are in bench/rotate_floor.py, the metric's
line in bench/rotate_report.py.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any

import asyncpg
from temporalio.client import Client

from bench.common import Progress, wait_settled, wait_until
from bench.env import BenchEnv, timings
from bench.result import Metric
from bench.rotate_floor import Waves, batches, floor, wave_ends
from bench.rotate_report import metric
from reaper.core.policy import rollout
from reaper.kit.agents import SimAgent
from reaper.kit.fleet import SimFleet
from workflows.common import liveness_id

SURGES = (("10a", 1), ("10b", 5))
"""The metric and its services' ``max_surge``."""
DEADLINE = "1h"
"""The drain's deadline: far enough never to fire here."""


# ---- reaper ---------------------------------------------------------------------------------


async def rotation(
    client: Client,
    pool: asyncpg.Pool,
    carried: dict[str, float],
    source: str,
    surge: int,
    timeout: float,
) -> tuple[Waves, float, list[float]]:
    """Drain ``source`` (holding ``services``' tasks) with ``migrate``; returns its waves
    from the update's answer, how long the update took to answer, and each replacement's
    time from placed to its agent's accepted beat carrying it (the agents' part inside
    reaper's run; ``carried``: when an accepted beat of ``worker/task`` first carried it)."""
    handle = client.get_workflow_handle(liveness_id(source))
    asked = time.time()
    answer = await handle.execute_update(
        "drain",
        {"reason": "bench rotation", "actor": "bench", "migrate": True, "deadline": DEADLINE},
    )
    t0 = time.time()
    if not (isinstance(answer, dict) and answer.get("migrating")):
        raise RuntimeError(f"the drain of {source} does not migrate: {answer}")

    async def drained() -> bool:
        return bool(
            await pool.fetchval(
                "SELECT drained_at IS NOT NULL FROM reaper.workers WHERE name = $1", source
            )
        )

    await wait_until(drained, timeout, f"{source} drained", poll=0.1)
    at = await pool.fetchval(
        "SELECT extract(epoch FROM max(at))::float8 FROM reaper.events"
        " WHERE worker = $1 AND action = 'drained'",
        source,
    )
    rows = await pool.fetch(
        "SELECT o.id, o.service, extract(epoch FROM o.state_changed_at)::float8 AS stopped,"
        " r.id AS rid, r.worker, extract(epoch FROM r.created_at)::float8 AS placed,"
        " extract(epoch FROM r.running_at)::float8 AS running"
        " FROM reaper.tasks o JOIN LATERAL (SELECT t.id, t.worker, t.created_at,"
        "  CASE WHEN t.state = 'running' THEN t.state_changed_at END AS running_at"
        "  FROM reaper.tasks t WHERE t.replaces = o.id ORDER BY t.created_at LIMIT 1) r ON true"
        " WHERE o.worker = $1 ORDER BY o.service, r.created_at",
        source,
    )
    per_service: dict[str, list[float]] = {}
    parts: dict[int, list[tuple[float, float, float]]] = {}
    by_service: dict[str, list[Any]] = {}
    for r in rows:
        by_service.setdefault(r["service"], []).append(r)
    for name, rs in by_service.items():
        ends = []
        for b in batches(rs, surge):
            ends.append(max(r["stopped"] for r in b) - t0)
        per_service[name] = ends
    ends = wave_ends(list(per_service.values()))
    for rs in by_service.values():
        for k, b in enumerate(batches(rs, surge)):
            start = t0 if k == 0 else t0 + ends[k - 1]
            parts.setdefault(k, []).append(
                (
                    max(r["placed"] for r in b) - start,
                    max(r["running"] or r["stopped"] for r in b) - start,
                    max(r["stopped"] for r in b) - start,
                )
            )
    slowest = [max(parts[k], key=lambda p: p[2]) for k in sorted(parts)]
    agents_part = [
        carried[f"{r['worker']}/{r['rid']}"] - r["placed"]
        for r in rows
        if f"{r['worker']}/{r['rid']}" in carried
    ]
    return Waves(at - t0, ends, slowest), t0 - asked, agents_part


# ---- the phase ------------------------------------------------------------------------------


async def run(
    env: BenchEnv, tasks: int, services: int, others: int, hb: float, progress: Progress
) -> list[Metric]:
    """10a and 10b: the floor for both surges first (no controller), then reaper's."""
    if not rollout.uses(rollout.ROTATING_HOSTS, env.peer_version):
        why = f"a migrating drain needs REAPER_PEER_VERSION=1.2 (the run's is {env.peer_version})"
        return [Metric(k, f"n/a: {why}", "-", "INFO") for k, _ in SURGES]
    per = tasks // services
    targets = [f"rot-{i:02d}" for i in range(others)]
    plans = {
        surge: {
            f"rot{surge}-svc{j}": [f"rot{surge}-svc{j}-{i:02d}" for i in range(per)]
            for j in range(services)
        }
        for _, surge in SURGES
    }
    noop = env.start_noop_worker(f"bench-rotate-noop-{uuid.uuid4().hex[:6]}")
    await env.wait_noop(noop)
    floors: dict[int, Waves] = {}
    for _, surge in SURGES:
        floors[surge] = await floor(env.client, noop.task_queue, targets, plans[surge], surge, hb)
        progress(f"  rotation floor, max_surge {surge}: {floors[surge].total:.2f} s")
    noop.stop()

    settings = {
        **timings(hb, 30 * hb, 60 * hb),
        "REAPER_DRAIN_DEADLINE": DEADLINE,
    }
    ctl = await env.start_controller("rotate", settings)
    progress(f"controller 'rotate' pid {ctl.pid} ({settings})")
    pool = await asyncpg.create_pool(ctl.db_url, min_size=1, max_size=2)
    carried: dict[str, float] = {}

    def on_beat(a: SimAgent, beats: list[dict[str, Any]], sent: float, acked: float | None) -> None:
        if acked is None:
            return
        for t in beats[-1].get("tasks", ()):
            carried.setdefault(f"{a.name}/{t}", acked)

    fleet = SimFleet(env.client, ctl.task_queue, hb, query_every=1, on_beat=on_beat)
    out: list[Metric] = []
    cpu0, load = ctl.cpu_seconds(), os.getloadavg()[0]
    cpu = 0.0
    try:
        fleet.start()
        agents = [
            SimAgent(n, lists={"containers": [], "volumes": [], "tasks": []}) for n in targets
        ]
        fleet.add(agents, spread=hb)
        for key, surge in SURGES:
            source = f"rot-src-{surge}"
            plan = plans[surge]
            for name, ids in plan.items():
                await pool.execute(
                    "INSERT INTO reaper.services (name, desired_count, max_surge)"
                    " VALUES ($1, $2, $3)",
                    name,
                    len(ids),
                    surge,
                )
                await pool.executemany(
                    "INSERT INTO reaper.tasks (id, service, worker, state)"
                    " VALUES ($1, $2, $3, 'running')",
                    [(t, name, source) for t in ids],
                )
            src = SimAgent(
                source,
                lists={
                    "containers": [],
                    "volumes": [],
                    "tasks": [t for ids in plan.values() for t in ids],
                },
            )
            fleet.add([src])

            async def registered(want: int = len(targets) + 1 + SURGES.index((key, surge))) -> bool:
                n = await pool.fetchval(
                    "SELECT count(*) FROM reaper.workers WHERE state = 'running'"
                )
                return bool(n >= want)

            await wait_until(registered, 120, "the rotation's workers running", poll=0.2)
            await asyncio.sleep(2 * hb)  # a few beats of the source: its report reconciled
            await wait_settled(env.client, {source: src.seq - 1}, 120)
            waves, answered, agents_part = await rotation(
                env.client, pool, carried, source, surge, 600
            )
            progress(f"  rotation, max_surge {surge}: drained {waves.total:.2f} s after the answer")
            out.append(
                metric(
                    key,
                    surge,
                    waves,
                    floors[surge],
                    answered,
                    agents_part,
                    hb,
                    len(plan),
                    tasks,
                    others,
                    DEADLINE,
                )
            )
    finally:
        await fleet.stop()
        await pool.close()
        cpu = ctl.cpu_seconds() - cpu0
        ctl.stop()
    for m in out:
        m.details.append(
            f"machine load average {load:.1f} at the phase's start on {os.cpu_count()} cores; "
            f"the controller used {cpu:.1f} s of CPU from its start to the end of both rotations"
        )
    return out
