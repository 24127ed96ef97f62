"""Postgres connection and schema migrations.

Migrations are the files ``migrations/NNN_name.sql``, applied in order, each in its own
transaction, under an advisory lock so that two controllers starting together apply each
once. Applying them again changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TypeVar

import asyncpg

log = logging.getLogger("reaper.db")

T = TypeVar("T")

MIGRATION_LOCK = 0x7265_6170  # "reap": advisory lock key held while migrating
CONNECT_DEADLINE_S = 120.0
"""How long to keep retrying an unreachable Postgres at start (CONTRACT.md §1: two minutes)."""


STATEMENT_TIMEOUT_S = 10.0
"""Postgres ``statement_timeout`` of the controller's connections: a statement running longer
is cancelled, so an activity attempt never outlives its ``start_to_close`` (15 s) in Postgres."""
LOCK_TIMEOUT_S = 3.0
"""Postgres ``lock_timeout``: a statement waiting this long for a lock (a table locked by a
``VACUUM FULL``, a migration, a stuck transaction) fails, releasing its connection; the
activity is retried with backoff (issue 11: one locked table must not hold the controller's
connections)."""
TRANSACTION_TIMEOUT_S = 12.0
"""Postgres ``transaction_timeout`` (PostgreSQL 17 and later): a transaction open this long is
ended by the server, so an attempt that timed out cannot commit after its retry started."""


def session_timeouts(server_version: int) -> dict[str, str]:
    """The ``server_settings`` that bound every statement, lock wait and transaction of a
    controller connection, in milliseconds (``transaction_timeout`` only where the server,
    ``server_version`` as in ``SHOW server_version_num``, knows it: 170000 and later)."""
    settings = {
        "statement_timeout": str(int(STATEMENT_TIMEOUT_S * 1000)),
        "lock_timeout": str(int(LOCK_TIMEOUT_S * 1000)),
    }
    if server_version >= 170000:
        settings["transaction_timeout"] = str(int(TRANSACTION_TIMEOUT_S * 1000))
    return settings


class Unreachable(Exception):
    """A service could not be reached within the start deadline; the message says which."""


async def create_pool(
    url: str,
    *,
    deadline_s: float = CONNECT_DEADLINE_S,
    min_size: int = 1,
    max_size: int = 10,
    timeouts: bool = False,
) -> asyncpg.Pool:
    """Open an asyncpg pool, retrying with backoff until ``deadline_s`` seconds have passed.

    With ``timeouts``, every connection runs under :func:`session_timeouts` (the controller's
    pools); without, as the server is configured (the CLI, the demo).

    Raises:
        Unreachable: Postgres did not accept a connection in time (the last error is named).
        asyncpg.InvalidPasswordError, asyncpg.InvalidCatalogNameError: bad credentials or
            database; these are not retried.
    """

    async def open_pool() -> asyncpg.Pool:
        server_settings = None
        if timeouts:
            probe = await asyncpg.connect(url)
            try:
                server_settings = session_timeouts(probe.get_server_version().major * 10000)
            finally:
                await probe.close()
        return await asyncpg.create_pool(
            url,
            min_size=min_size,
            max_size=max_size,
            command_timeout=30,
            server_settings=server_settings,
        )

    def retryable(exc: Exception) -> bool:
        if isinstance(exc, (asyncpg.InvalidPasswordError, asyncpg.InvalidCatalogNameError)):
            return False
        return isinstance(exc, (TimeoutError, OSError, asyncpg.PostgresError))

    return await with_backoff(open_pool, retryable, "Postgres", deadline_s=deadline_s)


def postgres_unavailable(exc: Exception) -> bool:
    """Whether ``exc`` may pass once Postgres is back: a connection refused, reset or closed
    mid-statement, a server shutting down or starting up, a timeout. Any other error (a bad
    statement, bad credentials) is not retried. The controller's start-up steps after its
    pools open (migrations, the secret) retry on these: a replica restarted while Postgres
    stopped exited on a connection closed mid-query (chaos smoke, 2026-12-05)."""
    return isinstance(
        exc,
        (
            TimeoutError,
            OSError,
            asyncpg.PostgresConnectionError,
            asyncpg.exceptions.OperatorInterventionError,
        ),
    )


async def with_backoff(
    call: Callable[[], Awaitable[T]],
    retryable: Callable[[Exception], bool],
    what: str,
    *,
    deadline_s: float = CONNECT_DEADLINE_S,
) -> T:
    """Run ``call`` again, backing off from 0.2 s to 5 s, while it fails with an error that
    ``retryable`` accepts: how the controller waits for Postgres and Temporal at start-up.

    Args:
        call: the call to make, safe to repeat.
        retryable: whether an error may pass once the service is back; any other is raised
            at once.
        what: the service (and what is asked of it), for the log line of each retry and
            the error.
        deadline_s: seconds after which the last retryable error is raised as
            :class:`Unreachable`.

    Raises:
        Unreachable: ``"{what} unreachable after {deadline_s}s: {last error}"``.
    """
    start = time.monotonic()
    delay = 0.2
    while True:
        try:
            return await call()
        except Exception as exc:
            if not retryable(exc):
                raise
            if time.monotonic() - start + delay > deadline_s:
                raise Unreachable(f"{what} unreachable after {deadline_s:g}s: {exc}") from exc
            log.warning("%s not reachable yet (%s); retrying in %.1fs", what, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


def _migrations() -> list[tuple[int, str, str]]:
    files = resources.files("reaper.infra").joinpath("migrations")
    found = []
    for entry in files.iterdir():
        name = entry.name
        if name.endswith(".sql"):
            found.append((int(name.split("_", 1)[0]), name, entry.read_text()))
    return sorted(found)


async def migrate(pool: asyncpg.Pool) -> list[str]:
    """Apply pending migrations; returns the names applied (empty when up to date).

    The controller's secret is then loaded by the caller (``activities.sealing.load_secret``),
    which this layer below the activities does not import."""
    applied: list[str] = []
    async with pool.acquire() as conn:
        # A replica starting beside another waits for its migrations, however long they take
        # (the pool's connections are reset to their own timeouts on release).
        await conn.execute(
            "SELECT set_config(name, '0', false) FROM pg_settings WHERE name IN"
            " ('statement_timeout', 'lock_timeout', 'transaction_timeout')"
        )
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
                await _apply(conn, version, name, sql)
                applied.append(name)
                log.info("applied migration %s", name)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)
    return applied


MIGRATION_LOCK_WAIT_S = 5.0
"""How long one attempt of a migration waits for a table lock (``lock_timeout``) before it
says whose lock it waits for and tries again."""


async def _apply(conn: asyncpg.Connection, version: int, name: str, sql: str) -> None:
    """Apply one migration in its own transaction, waiting for the table locks it needs for
    as long as they are held: a migration that alters a busy table (``ALTER TABLE`` takes
    an ``ACCESS EXCLUSIVE`` lock) waits for the transactions that hold it, a controller's
    for at most its ``transaction_timeout``, an operator's session for as long as it stays
    open. Every :data:`MIGRATION_LOCK_WAIT_S` it logs which sessions it waits for. An
    attempt that Postgres ends to break a deadlock is tried again (the upgrade test's
    overlap: migration 009 and the 1.1.0 replica's transaction, a clean clone's CI on
    8 December, where the new controller exited)."""
    while True:
        try:
            async with conn.transaction():
                await conn.execute(
                    "SELECT set_config('lock_timeout', $1, true)",
                    f"{int(MIGRATION_LOCK_WAIT_S * 1000)}",
                )
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO public.reaper_schema_migrations (version, name) VALUES ($1, $2)",
                    version,
                    name,
                )
            return
        except asyncpg.DeadlockDetectedError as exc:
            # A transaction that held one table and then asked for another the migration
            # holds (a replica of the previous release serving during a rolling upgrade):
            # Postgres ended the migration's attempt, which changed nothing. Try again.
            log.warning("migration %s was chosen to end a deadlock (%s): trying again", name, exc)
        except asyncpg.LockNotAvailableError:
            holders = await conn.fetch(
                "SELECT pid, state, xact_start, left(query, 80) AS query FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND xact_start IS NOT NULL ORDER BY xact_start LIMIT 5"
            )
            log.warning(
                "migration %s waits for a table lock held by another session; the oldest"
                " open transactions: %s",
                name,
                "; ".join(
                    f"pid {h['pid']} {h['state']} since {h['xact_start']:%H:%M:%S}: {h['query']}"
                    for h in holders
                )
                or "none listed",
            )
