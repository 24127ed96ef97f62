"""The stand-in scheduler: rows inserted as CONTRACT.md §3 allows (``containers``,
``volumes``, ``services``, ``tasks``), and the agents told what they now hold.

A container or volume is created the way a scheduler and an agent create one: either the
row is inserted ``creating``, the agent creates the handle, and the row becomes ``created``
(two-phase), or the agent holds the handle before its row is inserted ``created``. Some rows
the agent never holds: ``created`` ones (a handle that never came up: due after the TTL)
and ``creating`` ones (a creator that crashed: never marked, rule 2). A service is inserted
with its ``desired_count`` tasks, ``pending`` and placed round-robin on the workers Postgres
shows ``running`` and not draining, in one transaction, so it is never above its count.
Every statement is parameterised; a statement that fails (Postgres down, a table locked)
changes nothing the ledger records and is retried by a later round where it matters.
"""

from __future__ import annotations

import time

import asyncpg

from chaos.agents import Agents
from chaos.ledger import Insert, Ledger
from reaper.core import kinds

TABLES = {k.report: k.table for k in kinds.HANDLE_ROWS}
"""Kind -> table of every kind of handle row (``reaper.core.kinds``); fixed identifiers,
never input."""
DB_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)
"""What a scheduler insert may fail with while Postgres stops: counted as not inserted.
``InternalClientError`` ("cannot switch to state 15; another operation is in progress") is
asyncpg's answer to a statement cut off by a session the server ended (chaos seed 3,
2026-12-06: raised from a fire-and-forget insert, "Task exception was never retrieved")."""


class Scheduler:
    """Inserts rows for the campaign; ``pending`` holds two-phase rows still ``creating``."""

    def __init__(self, pool: asyncpg.Pool, agents: Agents, ledger: Ledger) -> None:
        self.pool, self.agents, self.ledger = pool, agents, ledger
        self.pending: dict[str, tuple[str, str, float | None]] = {}
        """Handle -> (kind, worker, first attempt): inserted ``creating``, held, not yet
        ``created``. The first attempt's time is kept: an attempt that failed may have
        committed, and the ledger must never say a row became ``created`` later than it did."""

    async def handle(self, kind: str, worker: str, handle: str, two_phase: bool) -> bool:
        """A handle the agent holds, and its row."""
        table = TABLES[kind]
        if two_phase:
            if not await self._run(
                f"INSERT INTO {table} (handle, worker, state) VALUES ($1, $2, 'creating')",
                handle,
                worker,
            ):
                return False
            self.agents.hold(worker, kind, handle)
            self.pending[handle] = (kind, worker, None)
            await self.complete_pending()
            return True
        self.agents.hold(worker, kind, handle)
        created = time.time()
        if not await self._run(
            f"INSERT INTO {table} (handle, worker, state) VALUES ($1, $2, 'created')",
            handle,
            worker,
        ):
            return False  # the agent holds an unknown handle: an orphan after the TTL
        self.ledger.inserts[handle] = Insert(kind, worker, created, held=True)
        return True

    async def complete_pending(self) -> None:
        """Move two-phase rows from ``creating`` to ``created`` (retried until done)."""
        for handle, (kind, worker, first) in list(self.pending.items()):
            created = first if first is not None else time.time()
            self.pending[handle] = (kind, worker, created)
            if await self._run(
                f"UPDATE {TABLES[kind]} SET state = 'created'"
                " WHERE handle = $1 AND state = 'creating'",
                handle,
            ):
                del self.pending[handle]
                self.ledger.inserts[handle] = Insert(kind, worker, created, held=True)

    async def phantom(self, kind: str, worker: str, handle: str, creating: bool) -> bool:
        """A row whose handle the agent never holds: ``creating`` (never marked) or
        ``created`` (destroyed once the TTL has passed)."""
        created = time.time()
        ok = await self._run(
            f"INSERT INTO {TABLES[kind]} (handle, worker, state) VALUES ($1, $2, $3)",
            handle,
            worker,
            "creating" if creating else "created",
        )
        if ok:
            self.ledger.inserts[handle] = Insert(kind, worker, created, held=False)
        return ok

    async def service(self, name: str, count: int, max_surge: int = 1) -> bool:
        """A service of ``count`` tasks placed round-robin on placeable workers; at most
        ``max_surge`` of its tasks migrate at once (CONTRACT.md §6.1)."""
        created = time.time()
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                workers = [
                    r["name"]
                    for r in await conn.fetch(
                        "SELECT name FROM reaper.workers WHERE state = 'running'"
                        " AND NOT draining ORDER BY name"
                    )
                ]
                if not workers:
                    return False
                await conn.execute(
                    "INSERT INTO reaper.services (name, desired_count, max_surge)"
                    " VALUES ($1, $2, $3)",
                    name,
                    count,
                    max_surge,
                )
                placed = [(f"{name}-{i}", workers[i % len(workers)]) for i in range(count)]
                await conn.executemany(
                    "INSERT INTO reaper.tasks (id, service, worker, state)"
                    " VALUES ($1, $2, $3, 'pending')",
                    [(t, name, w) for t, w in placed],
                )
        except DB_ERRORS:
            return False
        for t, w in placed:
            self.ledger.inserts[t] = Insert("tasks", w, created, held=False)
        return True

    async def _run(self, statement: str, *args: object) -> bool:
        try:
            await self.pool.execute(statement, *args)
            return True
        except DB_ERRORS:
            return False
