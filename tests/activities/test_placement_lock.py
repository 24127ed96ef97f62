"""A placement and a change of its worker's state happen one after the other
(``activities.tasks.placeable_load``): a retirement that holds the worker's row keeps a
placement's read waiting, and once it commits the retired worker is not placeable. Read
without a lock, a retirement committed between the read and the placement left tasks
``pending`` on a retired worker (the fleet timelines, inline activations). Real Postgres."""

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


async def test_a_placement_waits_for_a_retirement_of_its_worker_and_then_skips_it(pool):
    now = datetime.now(UTC)
    for name in ("p1", "p2"):
        await pool.execute(
            "INSERT INTO reaper.workers (name, state, state_since) VALUES ($1, 'running', $2)",
            name,
            now,
        )
    async with pool.acquire() as retiring, pool.acquire() as placing:
        tx = retiring.transaction()
        await tx.start()
        await retiring.execute("SELECT 1 FROM reaper.workers WHERE name = 'p1' FOR UPDATE")
        await retiring.execute("UPDATE reaper.workers SET state = 'retired' WHERE name = 'p1'")
        pid = placing.get_server_pid()

        async def place() -> dict[str, int]:
            async with placing.transaction():
                return await placeable_load(placing)

        read = asyncio.ensure_future(place())
        await eventually(
            lambda: _waiting_on_a_lock(pool, pid), bool, timeout=10, what="the read waits"
        )
        assert not read.done()
        await tx.commit()
        assert await asyncio.wait_for(read, 10) == {"p2": 0}


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
