"""A placement and a change of its worker's state happen one after the other
(``activities.tasks.placeable_load``): a placement skips a worker whose retirement is under
way, and a retirement waits for a placement that holds its worker. Read without a lock, a
retirement committed between the read and the placement left tasks ``pending`` on a retired
worker (the fleet timelines). Real Postgres."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from activities.tasks import placeable_load
from tests.support.polling import eventually


async def _waiting_on_a_lock(pool, pid: int) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
        )
    )


async def _workers(pool, *names: str) -> None:
    for name in names:
        await pool.execute(
            "INSERT INTO reaper.workers (name, state, state_since) VALUES ($1, 'running', $2)",
            name,
            datetime.now(UTC),
        )


async def test_a_placement_skips_a_worker_whose_retirement_is_under_way(pool):
    """Never waited on (a wait deadlocked two transactions that each hold a worker and then
    place): the placement goes to the others."""
    await _workers(pool, "p1", "p2")
    async with pool.acquire() as retiring, pool.acquire() as placing:
        async with retiring.transaction():
            await retiring.execute("SELECT 1 FROM reaper.workers WHERE name = 'p1' FOR UPDATE")
            async with placing.transaction():
                load = await asyncio.wait_for(placeable_load(placing), 10)
            assert load == {"p2": 0}
            await retiring.execute("UPDATE reaper.workers SET state = 'retired' WHERE name = 'p1'")
        async with placing.transaction():
            assert await placeable_load(placing) == {"p2": 0}


async def test_a_retirement_waits_for_a_placement_on_its_worker_and_then_sees_its_tasks(pool):
    await _workers(pool, "p4")
    async with pool.acquire() as retiring, pool.acquire() as placing:
        tx = placing.transaction()
        await tx.start()
        assert "p4" in await placeable_load(placing)
        pid = retiring.get_server_pid()
        lock = asyncio.ensure_future(
            retiring.execute("SELECT 1 FROM reaper.workers WHERE name = 'p4' FOR UPDATE")
        )
        await eventually(
            lambda: _waiting_on_a_lock(pool, pid), bool, timeout=10, what="the retirement waits"
        )
        assert not lock.done()
        await tx.commit()
        await asyncio.wait_for(lock, 10)


async def test_a_beats_row_refresh_is_not_held_up_by_a_placement(pool):
    """``FOR KEY SHARE``: the refresh of a beat (an ``UPDATE`` of non-key columns) goes on
    while a placement holds the worker's row."""
    now = datetime.now(UTC)
    await pool.execute(
        "INSERT INTO reaper.workers (name, state, state_since) VALUES ('p3', 'running', $1)", now
    )
    async with pool.acquire() as placing, placing.transaction():
        assert "p3" in await placeable_load(placing)
        await asyncio.wait_for(
            pool.execute("UPDATE reaper.workers SET last_heartbeat_at = $1 WHERE name = 'p3'", now),
            10,
        )
