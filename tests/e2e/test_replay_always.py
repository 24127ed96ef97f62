"""Workflows replayed mid-life: a controller whose workflow cache holds one workflow evicts
and replays its workflows between nearly every two activations, so any code path that a
replay takes differently from the run it replays (a patch decided in a signal handler, say)
fails its workflow task here at once. (A cache of none would not do: each task then replays
from the start and runs on, never resuming a run that was evicted midway.)

Dev server; an in-process controller with ``max_cached_workflows=1`` and a short sticky
timeout; two agents beating every second with complete reports (one dropping a handle and
gaining a row, one reporting an unknown one), so that signals race the run's first local
activity and the collectors' activities, and every other beat re-arms the deadline timer;
the fleet monitor reads the change feed meanwhile; then one worker is force-reaped while it
beats on (its loss and its reap written by local activities, ``in-task-loss``).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import asyncpg
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from tests.support.agents import Agents
from tests.support.controller import evicting_controller, make_settings, start_monitor
from tests.support.heartbeats import failed_tasks
from tests.support.polling import eventually
from tests.support.scheduler import insert
from tests.support.upgrade import features, sequence
from workflows.common import collector_id, fleet_monitor_id, liveness_id, reap_id

# The agents' interval, and STALL_AFTER three of them: a beat's task re-arms the deadline
# timer when it would fire before the next beat (``rearm-on-beat``, the suite's peer
# version), so such activations replay too (the dev server's runs here are short: a
# continue-as-new every 30 events; tests/workflows/test_rearm.py counts the re-arms).
TIMINGS = dict(
    heartbeat_interval=1.0, stall_after=3, lost_after=60, missing_ttl=3, resync_interval=1.0
)


async def last_seq(pool: asyncpg.Pool, worker: str) -> int:
    """``last_seq`` of the worker's row, or -1 before it is registered.

    Read from Postgres, not with the ``state`` query: a query sent while no workflow task is
    pending goes to a worker as a legacy query task, and a worker whose one-workflow cache
    does not hold the run replays it and applies the beats that arrived meanwhile on the
    previous task's clock, then sends what it decided there with the next real task
    (docs/stale-clock.md: an SDK defect, reproduced on purpose by test_query_race, repaired by
    the fleet monitor). Polling the query here made this test fail about 1 run in 10 under
    load, on that defect and not on reaper's code, which is what this test checks."""
    seq = await pool.fetchval("SELECT last_seq FROM reaper.workers WHERE name = $1", worker)
    return -1 if seq is None else int(seq)


async def beats_seen(pool: asyncpg.Pool, worker: str, n: int) -> None:
    """Wait until ``worker``'s row records ``n`` more beats (the row is refreshed about every
    other beat here, ``refresh-at-bound``, so the liveness has handled at least that many)."""
    start = await eventually(
        lambda: last_seq(pool, worker), lambda s: s >= 0, timeout=60, what=f"{worker} seen"
    )
    await eventually(
        lambda: last_seq(pool, worker),
        lambda s: s >= start + n,
        timeout=120,
        what=f"{n} more beats of {worker}",
    )


async def reap_done(client: Client, workflow_id: str) -> bool:
    """Whether the workflow ``workflow_id`` has closed (False while it does not exist yet: the
    liveness starts its reap child in a task of its own)."""
    try:
        return (await client.get_workflow_handle(workflow_id).describe()).close_time is not None
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return False
        raise


async def why_no_reap(client: Client, worker: str, keep: Path) -> str:
    """What a reap that did not end in time left to see: the liveness's failed workflow
    tasks (their histories kept in ``keep``), its last events, and its reap children. Once,
    in a clean clone's make test, the first reap had not ended 60 s after the forced loss
    was recorded, and six runs beside two busy loops did not show it again."""
    lines = [
        f"failed tasks of the liveness: {await failed_tasks(client, liveness_id(worker), keep)}"
    ]
    history = await client.get_workflow_handle(liveness_id(worker)).fetch_history()
    lines.append(f"its last events: {sequence(history)[-40:]}")
    for n in (1, 2, 3):
        try:
            d = await client.get_workflow_handle(reap_id(worker, n)).describe()
            lines.append(f"{reap_id(worker, n)}: {d.status.name if d.status else None}")
        except RPCError as exc:
            lines.append(f"{reap_id(worker, n)}: {exc}")
    return "\n".join(lines)


async def test_every_workflow_replays_the_way_it_ran(dev_env, pool, tmp_path) -> None:

    client = dev_env.client
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    suffix = uuid.uuid4().hex[:6]
    workers = [f"r{i}-{suffix}" for i in range(2)]
    for w in workers:
        await insert(pool, "containers", w, [f"{w}-c1", f"{w}-c2"])
    settings = make_settings(**TIMINGS)
    async with evicting_controller(client, pool, settings, tq):
        await start_monitor(client, settings, tq)
        with Agents(client, tq, interval=1.0) as agents:
            for w in workers:
                agents.reports[w] = {"containers": [f"{w}-c1", f"{w}-c2"], "volumes": []}
            await eventually(
                lambda: pool.fetchval("SELECT count(*) FROM reaper.workers"),
                lambda n: n == len(workers),
                timeout=60,
                what="every worker registered",
            )
            for w in workers:
                await beats_seen(pool, w, 2)
            agents.reports[workers[0]] = {"containers": [f"{workers[0]}-c1"], "volumes": []}
            agents.reports[workers[1]]["volumes"] = ["unknown-volume"]
            await insert(pool, "volumes", workers[0], [f"{workers[0]}-v1"])  # fed back
            for w in workers:
                await beats_seen(pool, w, 5)
            # A forced reap while the worker beats on: the loss is written by a local
            # activity that beats race (in-task-loss), and the reap child's transaction too;
            # the beats after it are the worker's return.
            reaped = workers[1]
            await client.get_workflow_handle(liveness_id(reaped)).signal(
                "force_reap", {"reason": "replayed reap", "actor": "test"}
            )
            await eventually(
                lambda: pool.fetchval(
                    "SELECT count(*) FROM reaper.events WHERE worker = $1 AND action = 'state'"
                    " AND reason LIKE '%-> lost%'",
                    reaped,
                ),
                lambda n: n >= 1,
                timeout=60,
                what="the forced loss recorded",
            )
            try:
                await eventually(
                    lambda: reap_done(client, reap_id(reaped, 1)),
                    bool,
                    timeout=60,
                    what="the reap done",
                )
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}\n{await why_no_reap(client, reaped, tmp_path)}"
                ) from exc
            await beats_seen(pool, reaped, 3)
            await eventually(
                lambda: pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", reaped),
                lambda st: st == "running",
                timeout=60,
                what="the reaped worker back",
            )
            reap = await client.get_workflow_handle(reap_id(reaped, 1)).fetch_history()
            assert "MARKER_RECORDED:core_local_activity:reap_worker" in features(reap)
        ids = [wid for w in workers for wid in (liveness_id(w), collector_id(w))]
        for wid in [*ids, fleet_monitor_id(tq), reap_id(reaped, 1)]:
            assert await failed_tasks(client, wid, tmp_path) == [], wid
        for wid in [*ids, fleet_monitor_id(tq)]:
            await client.get_workflow_handle(wid).terminate("test over")
