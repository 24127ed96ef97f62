"""Every controller statement is bounded in Postgres (issue 11): a lock wait fails after
``LOCK_TIMEOUT_S``, a statement after ``STATEMENT_TIMEOUT_S``, a transaction after
``TRANSACTION_TIMEOUT_S``, all shorter than an activity's ``start_to_close``; so an attempt
blocked by a locked table gives its connection back at once, and an attempt that stalled
inside its transaction cannot commit after its retry started. Either way the retry destroys
each row exactly once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
import pytest_asyncio

from activities import ReaperActivities
from activities.types import DestroyInput
from reaper.core.config import Settings
from reaper.infra.db import (
    LOCK_TIMEOUT_S,
    STATEMENT_TIMEOUT_S,
    TRANSACTION_TIMEOUT_S,
    create_pool,
)
from tests.support.polling import eventually
from tests.support.sealed import sealed
from workflows.common import ACTIVITY_TIMEOUT

WORKER = "w1"
VOLUMES = [f"v-{i}" for i in range(5)]
LONG_AGO = datetime(2026, 1, 1, tzinfo=UTC)


@pytest_asyncio.fixture
async def bounded(db_url: str, pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Pool]:
    """The controller's kind of pool (``timeouts=True``) on a migrated database holding a
    running worker with 5 volumes missing since long ago."""
    await pool.execute("INSERT INTO reaper.workers (name, state) VALUES ($1, 'running')", WORKER)
    await pool.executemany(
        "INSERT INTO reaper.volumes (handle, worker, missing_since) VALUES ($1, $2, $3)",
        [(v, WORKER, LONG_AGO) for v in VOLUMES],
    )
    p = await create_pool(db_url, timeouts=True, max_size=2)
    yield p
    try:  # a test that failed while holding a connection must not hang here
        await asyncio.wait_for(p.close(), timeout=10)
    except TimeoutError:
        p.terminate()


def destroy_input() -> DestroyInput:
    """A destroy as the collector sends it: a sealed report that lacked the volumes, taken
    now, and the cutoff that follows from it and the controller's ``MISSING_TTL``."""
    taken_at = datetime.now(UTC)
    ttl = Settings(_env_file=None).missing_ttl
    return DestroyInput(
        worker=WORKER,
        kind="volumes",
        cutoff=taken_at - timedelta(seconds=ttl),
        missing_ttl=ttl,
        report=sealed(WORKER, "volumes", [], taken_at),
    )


async def destroyed_events(pool: asyncpg.Pool) -> list[str]:
    return [
        r[0]
        for r in await pool.fetch(
            "SELECT handle FROM reaper.events WHERE action = 'destroyed' ORDER BY handle"
        )
    ]


def test_the_bounds_are_shorter_than_an_activity_attempt() -> None:
    attempt = ACTIVITY_TIMEOUT.total_seconds()
    assert LOCK_TIMEOUT_S < STATEMENT_TIMEOUT_S < TRANSACTION_TIMEOUT_S < attempt


async def test_every_connection_runs_under_the_bounds_even_after_a_reset(bounded) -> None:
    want = {
        "lock_timeout": f"{LOCK_TIMEOUT_S:g}s",
        "statement_timeout": f"{STATEMENT_TIMEOUT_S:g}s",
        "transaction_timeout": f"{TRANSACTION_TIMEOUT_S:g}s",
    }
    for _ in range(3):  # a connection is reset (RESET ALL) each time it goes back
        async with bounded.acquire() as conn:
            got = {name: await conn.fetchval(f"SHOW {name}") for name in want}
            await conn.execute("SET lock_timeout = 0")
        assert got == want


async def test_a_destroy_blocked_by_a_locked_table_fails_fast_and_its_retry_destroys_once(
    db_url, pool, bounded
) -> None:
    acts = ReaperActivities(pool, Settings(_env_file=None), gc_pool=bounded)
    locker = await asyncpg.connect(db_url)
    held = locker.transaction()
    await held.start()
    await locker.execute("LOCK TABLE reaper.volumes IN ACCESS EXCLUSIVE MODE")
    try:
        started = time.monotonic()
        with pytest.raises(asyncpg.LockNotAvailableError):
            await acts.destroy_missing(destroy_input())
        assert time.monotonic() - started < LOCK_TIMEOUT_S + 2
        # The heartbeat's side meanwhile: its pool is not the one the collection waits in.
        assert await pool.fetchval("SELECT state FROM reaper.workers") == "running"
    finally:
        await held.rollback()
        await locker.close()
    first = await acts.destroy_missing(destroy_input())  # the retry
    again = await acts.destroy_missing(destroy_input())  # and a duplicate retry
    assert sorted(first.destroyed) == VOLUMES and again.destroyed == []
    assert await destroyed_events(pool) == VOLUMES


async def test_an_attempt_stalled_in_its_transaction_never_commits_after_its_retry(
    pool, bounded
) -> None:
    acts = ReaperActivities(pool, Settings(_env_file=None), gc_pool=bounded)
    stalled = await bounded.acquire()
    try:
        pid = stalled.get_server_pid()
        tx = stalled.transaction()
        await tx.start()
        # What destroy_missing's transaction does, then the attempt stalls (a frozen
        # process, a lost network) past its start_to_close, when Temporal starts the retry.
        await stalled.execute("DELETE FROM reaper.volumes WHERE worker = $1", WORKER)
        await stalled.execute(
            "INSERT INTO reaper.events (worker, kind, handle, action) VALUES ($1, 'volume',"
            " 'x', 'destroyed')",
            WORKER,
        )
        await eventually(
            lambda: pool.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid),
            lambda n: n == 0,
            timeout=TRANSACTION_TIMEOUT_S + 10,
            poll=0.2,
            what="the stalled transaction ended by the server",
        )
        # The commit cannot reach a session the server ended. How asyncpg says so depends on
        # whether it has read the end yet: a closed connection, or (a fresh clone's CI run,
        # 2026-12-06) "cannot switch to state 15; another operation (2) is in progress"
        # while it still consumes the server's last message, its FATAL error. What counts
        # is below: the retry destroys everything and no event of the attempt committed.
        with pytest.raises(
            (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError)
        ):
            await tx.commit()
    finally:
        await bounded.release(stalled)
    retry = await acts.destroy_missing(destroy_input())
    assert sorted(retry.destroyed) == VOLUMES
    assert await destroyed_events(pool) == VOLUMES
