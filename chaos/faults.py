"""The faults, each a coroutine that ends by itself (or early, at :meth:`Faults.end_all`).

Every fault opens a window in the ledger while it holds: ``replica-N-down``,
``temporal-down``, ``postgres-down``, ``lock TABLE``, ``sleep TARGET``, ``terminate``.
Kills are real: SIGKILL of a replica or of the dev server (restarted on its SQLite file),
``pg_ctl stop -m immediate`` of Postgres (a crash: recovery on restart). The slow-database
faults use sessions of their own (``application_name`` ``chaos-fault``): a table locked
``ACCESS EXCLUSIVE``, rows locked by a session that sleeps in ``pg_sleep``, and
``pg_terminate_backend`` of every controller connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import asyncpg

from chaos.ledger import Ledger
from chaos.stack import START_TIMEOUT_S, Stack
from reaper.core import kinds

LOCKABLE = (
    *(k.table for k in kinds.ALL),
    "reaper.workers",
    "reaper.events",
    "reaper.fleet",
    "reaper.services",
)
"""Tables a fault may lock; fixed identifiers, never input."""
ROW_LOCKS = {
    "workers": "SELECT 1 FROM reaper.workers FOR UPDATE",
    "fleet": "SELECT 1 FROM reaper.fleet WHERE id = 1 FOR UPDATE",
    "reap_tokens": "SELECT 1 FROM reaper.reap_tokens WHERE id = 1 FOR UPDATE",
    "services": "SELECT 1 FROM reaper.services FOR UPDATE",
    "tasks": "SELECT 1 FROM reaper.tasks WHERE state IN ('pending', 'running') FOR UPDATE",
}
"""Rows a sleeping session may hold locked, by name."""
TERMINATE = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND backend_type = 'client backend' AND application_name NOT LIKE 'chaos%'"
)
"""Every connection of the controllers (the campaign's own are named ``chaos*``)."""


class Faults:
    """Starts faults in the background; ``busy`` names what is being disrupted now."""

    def __init__(self, stack: Stack, ledger: Ledger, say: Callable[[str], None]) -> None:
        self.stack, self.ledger, self.say = stack, ledger, say
        self.busy: set[str] = set()
        self.tasks: list[asyncio.Task[None]] = []
        self.ending = asyncio.Event()

    def start(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the background, with ``name`` in ``busy`` until it ends."""
        self.busy.add(name)

        async def run() -> None:
            try:
                await coro
            except Exception as exc:  # a fault that could not run is reported, not fatal
                self.say(f"fault {name}: {type(exc).__name__}: {exc}")
            finally:
                self.busy.discard(name)

        self.tasks.append(asyncio.get_running_loop().create_task(run()))

    async def end_all(self) -> None:
        """End every fault now: locks released, everything down started again."""
        self.ending.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for i, c in enumerate(self.stack.replicas):
            if not c.alive():
                c.start()
                self.say(f"replica {i} started (end of faults)")

    async def _hold(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.ending.wait(), seconds)
        except TimeoutError:
            pass

    # ---- processes ---------------------------------------------------------------------

    async def kill_replica(self, i: int, down_s: float) -> None:
        c = self.stack.replicas[i]
        c.kill()
        self.ledger.kills += 1
        window = self.ledger.fault(f"replica-{i}-down", time.time())
        self.say(f"SIGKILL replica {i}; restart in {down_s:.1f}s")
        await self._hold(down_s)
        c.start()
        window.end = time.time()

    async def restart_temporal(self, down_s: float) -> None:
        self.stack.temporal.kill()
        self.ledger.kills += 1
        window = self.ledger.fault("temporal-down", time.time())
        self.say(f"SIGKILL the Temporal dev server; restart in {down_s:.1f}s")
        await self._hold(down_s)
        try:
            await self.stack.temporal.up(START_TIMEOUT_S)
        finally:
            window.end = time.time()

    async def restart_postgres(self, mode: str, down_s: float) -> None:
        window = self.ledger.fault("postgres-down", time.time())
        try:
            await self.stack.pg_down(mode)
            if mode == "immediate":
                self.ledger.kills += 1
            self.say(f"Postgres stopped ({mode}); restart in {down_s:.1f}s")
            await self._hold(down_s)
        finally:
            try:
                await self.stack.pg_up()
            finally:
                window.end = time.time()

    # ---- a slow database ---------------------------------------------------------------

    async def _connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(
            self.stack.pg.url, timeout=5, server_settings={"application_name": "chaos-fault"}
        )

    async def lock_table(self, table: str, hold_s: float) -> None:
        """``LOCK TABLE ... IN ACCESS EXCLUSIVE MODE`` held for ``hold_s``."""
        assert table in LOCKABLE
        conn = await self._connect()
        try:
            async with conn.transaction():
                await conn.execute("SET LOCAL lock_timeout = '5s'")
                await conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
                window = self.ledger.fault(f"lock {table}", time.time())
                self.say(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE for {hold_s:.0f}s")
                try:
                    await self._hold(hold_s)
                finally:
                    window.end = time.time()
                raise _Rollback
        except _Rollback:
            pass
        finally:
            await conn.close(timeout=5)

    async def sleep_locked(self, target: str, hold_s: float) -> None:
        """A session that locks ``ROW_LOCKS[target]`` and sleeps in ``pg_sleep``."""
        conn = await self._connect()
        try:
            async with conn.transaction():
                await conn.execute("SET LOCAL lock_timeout = '5s'")
                await conn.execute(ROW_LOCKS[target])
                window = self.ledger.fault(f"sleep {target}", time.time())
                self.say(f"{target} rows locked by a session in pg_sleep for {hold_s:.0f}s")
                try:
                    until = time.monotonic() + hold_s
                    while not self.ending.is_set() and time.monotonic() < until:
                        await conn.execute("SELECT pg_sleep(0.5)")
                finally:
                    window.end = time.time()
                raise _Rollback
        except _Rollback:
            pass
        finally:
            await conn.close(timeout=5)

    async def terminate(self) -> None:
        """``pg_terminate_backend`` of every controller connection."""
        conn = await self._connect()
        try:
            window = self.ledger.fault("terminate", time.time())
            n = await conn.fetchval(TERMINATE)
            window.end = time.time()
            self.say(f"pg_terminate_backend of {n} controller connections")
        finally:
            await conn.close(timeout=5)


class _Rollback(Exception):
    """Leaves a fault's transaction without committing anything."""
