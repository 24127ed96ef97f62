"""One slow table must not stall a worker's whole collection (issue 11; Concourse #4152).

w1 holds 20 containers and 20 volumes and drops 5 of each; a second before they fall due
another session takes ``LOCK TABLE reaper.volumes IN ACCESS EXCLUSIVE MODE`` (a VACUUM FULL,
a migration, a stuck transaction) and holds it for longer than an activity's
``start_to_close``. The containers, which need nothing from ``volumes``, are destroyed while
the lock is held; the volumes after it is released; each exactly once, although the volume
attempts that were blocked timed out and were retried. Heartbeats go on meanwhile.
Real controller process, real dev server and Postgres; time is real, polled with deadlines.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter

import asyncpg
import pytest

from tests.support.agents import Agents
from tests.support.controller import ControllerProcess
from tests.support.heartbeats import beats_handled
from tests.support.polling import eventually
from workflows.common import ACTIVITY_TIMEOUT

TTL_S = 5
HOLD_S = ACTIVITY_TIMEOUT.total_seconds() + 10  # longer than one activity attempt may take
TIMINGS = {
    "REAPER_HEARTBEAT_INTERVAL": "1s",
    "REAPER_STALL_AFTER": "3s",
    "REAPER_LOST_AFTER": "60s",
    "REAPER_MISSING_TTL": f"{TTL_S}s",
    "REAPER_RESYNC_INTERVAL": "1s",
}


@pytest.fixture
def controller_proc(dev_env, db_url, tmp_path) -> ControllerProcess:
    address = dev_env.client.service_client.config.target_host
    proc = ControllerProcess(address, db_url, tmp_path / "controller.log", TIMINGS)
    yield proc
    proc.stop()


async def _count(pool: asyncpg.Pool, table: str, worker: str) -> int:
    return await pool.fetchval(f"SELECT count(*) FROM reaper.{table} WHERE worker = $1", worker)


async def test_locked_volumes_table_stalls_neither_containers_nor_heartbeats(
    dev_env, pool, db_url, controller_proc
):
    client = dev_env.client
    w = f"w1-{uuid.uuid4().hex[:6]}"
    containers = [f"c-{i:02}" for i in range(20)]
    volumes = [f"v-{i:02}" for i in range(20)]
    for table, handles in (("containers", containers), ("volumes", volumes)):
        await pool.executemany(
            f"INSERT INTO reaper.{table} (handle, worker) VALUES ($1, $2)",
            [(h, w) for h in handles],
        )
    controller_proc.start()
    with Agents(client, controller_proc.task_queue) as agents:
        agents.reports[w] = {"containers": containers, "volumes": volumes}
        await eventually(
            lambda: pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", w),
            lambda s: s == "running",
            timeout=60,
            what="w1 registered",
        )
        await beats_handled(client, w, 2)
        # A drop of 5 of 20 is below the mass-drop hold (0.5), so it is believed at once.
        agents.reports[w] = {"containers": containers[5:], "volumes": volumes[5:]}
        due = await eventually(
            lambda: pool.fetchval(
                "SELECT max(missing_since) + make_interval(secs => $2) FROM"
                " (SELECT missing_since FROM reaper.containers WHERE worker = $1"
                "  UNION ALL SELECT missing_since FROM reaper.volumes WHERE worker = $1) m"
                " HAVING count(missing_since) = 10",
                w,
                TTL_S,
            ),
            lambda d: d is not None,
            timeout=60,
            what="5 containers and 5 volumes marked",
        )
        await eventually(
            lambda: pool.fetchval("SELECT now() >= $1::timestamptz - interval '1 second'", due),
            bool,
            timeout=30,
            poll=0.02,
            what="a second before the marks fall due",
        )
        locker = await asyncpg.connect(db_url)
        held = locker.transaction()
        await held.start()
        await locker.execute("LOCK TABLE reaper.volumes IN ACCESS EXCLUSIVE MODE")
        locked_at = time.monotonic()
        try:
            await eventually(
                lambda: _count(pool, "containers", w),
                lambda n: n == 15,
                timeout=HOLD_S - 3,
                poll=0.2,
                what=f"containers destroyed while volumes is locked\n{controller_proc.tail()}",
            )
            # Heartbeats are recorded meanwhile: the worker never looks stalled.
            seen = await pool.fetchval(
                "SELECT last_heartbeat_at FROM reaper.workers WHERE name = $1", w
            )
            await eventually(
                lambda: pool.fetchrow(
                    "SELECT state, last_heartbeat_at FROM reaper.workers WHERE name = $1", w
                ),
                lambda r: r["state"] == "running" and r["last_heartbeat_at"] > seen,
                timeout=10,
                what="a heartbeat recorded while volumes is locked",
            )
            # Hold past a whole activity attempt: a volume attempt blocked by the lock must
            # have given up and been retried before the lock goes.
            await asyncio.sleep(max(0.0, HOLD_S - (time.monotonic() - locked_at)))
            assert (
                await pool.fetchval(
                    "SELECT count(*) FROM reaper.events WHERE worker = $1 AND kind = 'volume'", w
                )
                == 0
            ), "a volume was destroyed through the lock"
        finally:
            await held.rollback()
            await locker.close()
        await eventually(
            lambda: _count(pool, "volumes", w),
            lambda n: n == 15,
            timeout=60,
            what=f"volumes destroyed after the lock is released\n{controller_proc.tail()}",
        )
        await beats_handled(client, w, 3)  # more beats, resyncs and retries: still once
        state = await pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", w)
    destroyed = Counter(
        (r["kind"], r["handle"])
        for r in await pool.fetch(
            "SELECT kind, handle FROM reaper.events WHERE worker = $1 AND action = 'destroyed'", w
        )
    )
    want = {("container", h) for h in containers[:5]} | {("volume", h) for h in volumes[:5]}
    assert set(destroyed) == want and set(destroyed.values()) == {1}, destroyed
    assert (
        sorted(r[0] for r in await pool.fetch("SELECT handle FROM reaper.containers"))
        == (containers[5:])
    )
    assert state == "running"
