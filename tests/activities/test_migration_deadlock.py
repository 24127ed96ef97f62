"""A migration that Postgres ends to break a deadlock is tried again
(``reaper.infra.db._apply``): in the upgrade test's overlap, migration 009 and a 1.1.0
replica's transaction each held a table the other asked for, and the new controller exited.
Real Postgres; the deadlock is made the way it happened: a session holds one table, the
migration takes another and waits for the first, the session then asks for the second."""

from __future__ import annotations

import asyncio

from reaper.infra.db import _apply
from tests.support.polling import eventually

SQL = "ALTER TABLE public.dl_b ADD COLUMN c int; ALTER TABLE public.dl_a ADD COLUMN c int;"


async def _waiting(pool, pid: int) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
        )
    )


async def test_a_migration_ended_by_a_deadlock_is_tried_again(pool):
    await pool.execute("CREATE TABLE public.dl_a (id int); CREATE TABLE public.dl_b (id int)")
    await pool.execute("INSERT INTO public.dl_a VALUES (1)")
    async with pool.acquire() as other, pool.acquire() as migrating:
        # This session waits longer before it looks for deadlocks than the migration's
        # (1 s, the default): Postgres then ends the migration's attempt, never this one.
        await other.execute("SET deadlock_timeout = '20s'")
        tx = other.transaction()
        await tx.start()
        await other.execute("UPDATE public.dl_a SET id = 2")  # holds dl_a
        applied = asyncio.ensure_future(_apply(migrating, 9999, "9999_test.sql", SQL))
        pid = migrating.get_server_pid()
        await eventually(lambda: _waiting(pool, pid), bool, timeout=20, what="migration waits")
        # The migration holds dl_b and waits for dl_a; asking for dl_b closes the cycle.
        # Postgres ends the migration's attempt; its retry waits for dl_a until this commits.
        await other.execute("SELECT count(*) FROM public.dl_b")
        await tx.commit()
        await asyncio.wait_for(applied, 30)
    columns = await pool.fetchval(
        "SELECT count(*) FROM information_schema.columns"
        " WHERE table_name IN ('dl_a', 'dl_b') AND column_name = 'c'"
    )
    assert columns == 2
    assert await pool.fetchval(
        "SELECT name FROM public.reaper_schema_migrations WHERE version = 9999"
    ) == ("9999_test.sql")
