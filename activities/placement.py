"""Backfilling services: replacement ``pending`` tasks placed on healthy workers (rule 5)."""

from __future__ import annotations

import uuid
from typing import Iterable

import asyncpg

from activities.base import write_events
from reaper.core.policy.placement import deficit, place

REPLACEABLE_STOP_REASONS = ["worker-lost", "missing"]
"""Tasks that reaper took down, and so replaces; a task the user stopped is never replaced."""


async def backfill(
    conn: asyncpg.Connection,
    services: Iterable[str | None],
    reason: str,
    actor: str | None = None,
    *,
    dry_run: bool = False,
    assume_inactive: Iterable[str | None] = (),
) -> tuple[list[tuple[str, str]], int]:
    """Bring each service back to ``desired_count`` with replacement ``pending`` tasks.

    Each replacement goes to the healthy (``running``), non-draining worker with the fewest
    pending and running tasks (:func:`reaper.core.policy.placement.place`), and names in ``replaces`` a task
    of the service that reaper took down and that has no replacement yet. Runs in the
    caller's transaction with the service row locked, so a retry or a concurrent backfill
    counts the replacements already made and places nothing twice.

    ``assume_inactive`` (dry run) lists the service of each task that would have been taken
    down, so the would-be replacements are counted as if it had been.

    Returns:
        ``([(new_task_id, worker), ...], unplaced)``: unplaced counts tasks still owed
        because no healthy worker was available.
    """
    placed: list[tuple[str, str]] = []
    unplaced = 0
    # In a dry run nothing was taken down: count what would have been as gone already.
    pretend_gone: dict[str | None, int] = {}
    for s in assume_inactive:
        pretend_gone[s] = pretend_gone.get(s, 0) + 1
    for service in sorted({s for s in services if s is not None}):
        desired = await conn.fetchval(
            "SELECT desired_count FROM reaper.services WHERE name = $1 FOR UPDATE", service
        )
        if desired is None:
            continue
        active = await conn.fetchval(
            "SELECT count(*) FROM reaper.tasks"
            " WHERE service = $1 AND state IN ('pending', 'running')",
            service,
        )
        missing = deficit(desired, active, pretend_gone.get(service, 0))
        if missing == 0:
            continue
        unreplaced = [
            r["id"]
            for r in await conn.fetch(
                "SELECT t.id FROM reaper.tasks t"
                " WHERE t.service = $1 AND t.state IN ('lost', 'stopped')"
                "  AND t.stop_reason = ANY($2::text[])"
                "  AND NOT EXISTS (SELECT 1 FROM reaper.tasks r WHERE r.replaces = t.id)"
                " ORDER BY t.updated_at, t.id",
                service,
                REPLACEABLE_STOP_REASONS,
            )
        ]
        candidates = {
            r["name"]: r["load"]
            for r in await conn.fetch(
                "SELECT w.name, count(t.id) AS load FROM reaper.workers w"
                " LEFT JOIN reaper.tasks t"
                "  ON t.worker = w.name AND t.state IN ('pending', 'running')"
                " WHERE w.state = 'running' AND NOT w.draining GROUP BY w.name"
            )
        }
        chosen = place(candidates, missing)
        unplaced += missing - len(chosen)
        for i, worker in enumerate(chosen):
            replaces = unreplaced[i] if i < len(unreplaced) else None
            new_id = f"{service}-{uuid.uuid4().hex[:12]}"
            if not dry_run:
                await conn.execute(
                    "INSERT INTO reaper.tasks (id, service, worker, state, replaces)"
                    " VALUES ($1, $2, $3, 'pending', $4)",
                    new_id, service, worker, replaces,
                )
            detail = f"{reason}; on {worker}" + (f", replaces {replaces}" if replaces else "")
            await write_events(
                conn, worker, "task", "replaced", [new_id], detail, actor, dry_run=dry_run
            )
            placed.append((new_id, worker))
    return placed, unplaced
