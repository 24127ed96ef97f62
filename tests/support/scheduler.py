"""Rows as the scheduler writes them (CONTRACT.md §3), and what reaper made of them."""

from __future__ import annotations

import asyncpg


async def insert(
    pool: asyncpg.Pool, table: str, worker: str, handles: list[str], state: str = "created", at=None
) -> None:
    """Rows as the scheduler inserts them; ``at`` stamps their state change (the test
    server's clock runs ahead of Postgres', so tests that care pass the workflow time)."""
    await pool.executemany(
        f"INSERT INTO reaper.{table} (handle, worker, state, state_changed_at)"
        " VALUES ($1, $2, $3, COALESCE($4::timestamptz, now()))",
        [(h, worker, state, at) for h in handles],
    )


async def rows(pool: asyncpg.Pool, table: str, worker: str) -> dict[str, object]:
    """``worker``'s rows of ``table``: handle (or task id) -> ``missing_since``."""
    key = "id" if table == "tasks" else "handle"
    return {
        r[key]: r["missing_since"]
        for r in await pool.fetch(
            f"SELECT {key}, missing_since FROM reaper.{table} WHERE worker = $1", worker
        )
    }


async def setup_service(pool: asyncpg.Pool, service: str, placements: dict[str, list[str]]) -> None:
    """A service whose desired count is its tasks, each ``pending`` on its worker."""
    total = sum(len(t) for t in placements.values())
    await pool.execute(
        "INSERT INTO reaper.services (name, desired_count) VALUES ($1, $2)", service, total
    )
    for worker, tasks in placements.items():
        for t in tasks:
            await pool.execute(
                "INSERT INTO reaper.tasks (id, service, worker, state) VALUES ($1,$2,$3,'pending')",
                t,
                service,
                worker,
            )


async def task_states(pool: asyncpg.Pool) -> dict[str, tuple]:
    """Every task: id -> (worker, state, stop_reason, replaces)."""
    return {
        r["id"]: (r["worker"], r["state"], r["stop_reason"], r["replaces"])
        for r in await pool.fetch("SELECT * FROM reaper.tasks")
    }
