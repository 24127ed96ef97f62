"""Simulated hosts that run what reaper places on them, for tests of drains that migrate
(CONTRACT.md §6): each beat reports the tasks a host runs; what its ``state`` assigns it
runs from its next beat, what it lists as orphans it removes. A silent host beats no more."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import asyncpg

from reaper.core.contract import StateView
from tests.support.fleet import Fleet


class Hosts:
    """Hosts of ``fleet`` that start their assignments and remove their orphans."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.tasks: dict[str, set[str]] = {}
        self.silent: set[str] = set()

    async def start(self, worker: str, tasks: Iterable[str] = ()) -> StateView:
        """A host that runs ``tasks`` beats for the first time."""
        self.tasks[worker] = set(tasks)
        return await self.beat(worker)

    async def beat(self, worker: str) -> StateView:
        """One beat of ``worker``; it then runs its assignments and drops its orphans."""
        st = await self.fleet.beat(worker, tasks=sorted(self.tasks[worker]))
        self.tasks[worker] |= set(st.assignments)
        self.tasks[worker] -= set(st.orphans_by_kind.get("tasks", []))
        return st

    async def run(self, seconds: float, step: float = 10.0, watch: Any = None) -> None:
        """Let ``seconds`` pass, every host not silent beating every ``step``; after each
        round ``watch()`` is awaited if given (an invariant checked as time goes)."""
        left = seconds
        while left > 0:
            await self.fleet.advance(min(step, left))
            left -= step
            for worker in sorted(self.tasks):
                if worker not in self.silent:
                    await self.beat(worker)
            if watch is not None:
                await watch()


async def service_counts(pool: asyncpg.Pool, service: str) -> tuple[int, int, int]:
    """``(desired_count, max_surge, active tasks)`` of ``service``."""
    row = await pool.fetchrow(
        "SELECT desired_count, max_surge, (SELECT count(*) FROM reaper.tasks t"
        " WHERE t.service = s.name AND t.state IN ('pending', 'running')) AS active"
        " FROM reaper.services s WHERE s.name = $1",
        service,
    )
    return row["desired_count"], row["max_surge"], row["active"]


async def tasks_of(pool: asyncpg.Pool, service: str) -> dict[str, asyncpg.Record]:
    """Every task of ``service``: id -> its row."""
    return {
        r["id"]: r
        for r in await pool.fetch(
            "SELECT id, worker, state, stop_reason, replaces FROM reaper.tasks"
            " WHERE service = $1 ORDER BY created_at, id",
            service,
        )
    }
