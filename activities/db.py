"""Postgres connection and schema migrations.

Migrations are the files ``migrations/NNN_name.sql``, applied in order, each in its own
transaction, under an advisory lock so that two controllers starting together apply each
once. Applying them again changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from importlib import resources

import asyncpg

from activities.sealing import load_secret

log = logging.getLogger("reaper.db")

MIGRATION_LOCK = 0x7265_6170  # "reap": advisory lock key held while migrating
CONNECT_DEADLINE_S = 120.0
"""How long to keep retrying an unreachable Postgres at start (CONTRACT.md §1: two minutes)."""


class Unreachable(Exception):
    """A service could not be reached within the start deadline; the message says which."""


async def create_pool(
    url: str, *, deadline_s: float = CONNECT_DEADLINE_S, min_size: int = 1, max_size: int = 10
) -> asyncpg.Pool:
    """Open an asyncpg pool, retrying with backoff until ``deadline_s`` seconds have passed.

    Raises:
        Unreachable: Postgres did not accept a connection in time (the last error is named).
        asyncpg.InvalidPasswordError, asyncpg.InvalidCatalogNameError: bad credentials or
            database; these are not retried.
    """
    start = time.monotonic()
    delay = 0.2
    while True:
        try:
            return await asyncpg.create_pool(
                url, min_size=min_size, max_size=max_size, command_timeout=30
            )
        except (asyncpg.InvalidPasswordError, asyncpg.InvalidCatalogNameError):
            raise
        except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
            if time.monotonic() - start + delay > deadline_s:
                raise Unreachable(f"Postgres unreachable after {deadline_s:g}s: {exc}") from exc
            log.warning("Postgres not reachable yet (%s); retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


def _migrations() -> list[tuple[int, str, str]]:
    files = resources.files("activities").joinpath("migrations")
    found = []
    for entry in files.iterdir():
        name = entry.name
        if name.endswith(".sql"):
            found.append((int(name.split("_", 1)[0]), name, entry.read_text()))
    return sorted(found)


async def migrate(pool: asyncpg.Pool) -> list[str]:
    """Apply pending migrations, then load the controller's secret into this process
    (``activities.sealing``); returns the names applied (empty when up to date)."""
    applied: list[str] = []
    async with pool.acquire() as conn:
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
        try:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS public.reaper_schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {
                r["version"]
                for r in await conn.fetch("SELECT version FROM public.reaper_schema_migrations")
            }
            for version, name, sql in _migrations():
                if version in done:
                    continue
                async with conn.transaction():
                    await conn.execute(sql)
                    await conn.execute(
                        "INSERT INTO public.reaper_schema_migrations (version, name)"
                        " VALUES ($1, $2)",
                        version,
                        name,
                    )
                applied.append(name)
                log.info("applied migration %s", name)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)
    await load_secret(pool)
    return applied
