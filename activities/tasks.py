"""Tasks taken down and services backfilled (CONTRACT.md rule 5, §5.1 owed work).

Shared by reaps, retirements, destroys of missing tasks and the fleet monitor. Each verb
runs inside its caller's transaction, with the rows it changes locked, so a retry or a
concurrent caller changes nothing twice and no service goes above ``desired_count``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence

import asyncpg

from activities.base import write_events
from reaper.core import states
from reaper.core.policy import migration
from reaper.core.policy.placement import deficit, place
from reaper.core.policy.placement import place_owed as place_owed_policy

REPLACEABLE_STOP_REASONS = ["worker-lost", "worker-retired", "missing", migration.DEADLINE]
"""Tasks that reaper took down, and so replaces (a drain's deadline, §6.1, as after a loss);
a task the user stopped, or one a drain replaced or an undrain cancelled, is never."""


async def backfill(
    conn: asyncpg.Connection,
    services: Iterable[str | None],
    reason: str,
    actor: str | None = None,
    *,
    dry_run: bool = False,
    assume_inactive: Iterable[str | None] = (),
    exclude: str | None = None,
) -> tuple[list[tuple[str, str]], int]:
    """Bring each service back to ``desired_count`` with replacement ``pending`` tasks.

    Each replacement goes to the healthy (``running``), non-draining worker with the fewest
    pending and running tasks (:func:`reaper.core.policy.placement.place`), and names in
    ``replaces`` a task
    of the service that reaper took down and that has no replacement yet. Runs in the
    caller's transaction with the service row locked, so a retry or a concurrent backfill
    counts the replacements already made and places nothing twice.

    ``exclude`` names a worker that must get nothing (the one being retired).
    ``assume_inactive`` (dry run) lists the service of each task that would have been taken
    down, so the would-be replacements are counted as if it had been.

    A replacement with no placeable worker is owed: a ``pending`` row with ``worker`` NULL,
    counted among the service's active tasks, placed later by :func:`place_owed`.

    Returns:
        ``([(new_task_id, worker), ...], owed)``: owed counts replacements created with no
        worker because no healthy, non-draining worker was available.
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
            "SELECT count(*) FROM reaper.tasks WHERE service = $1 AND state = ANY($2::text[])",
            service,
            states.ACTIVE_TASKS,
        )
        missing = deficit(desired, active, pretend_gone.get(service, 0))
        if missing == 0:
            continue
        unreplaced = [
            r["id"]
            for r in await conn.fetch(
                "SELECT t.id FROM reaper.tasks t"
                " WHERE t.service = $1 AND t.state = ANY($3::text[])"
                "  AND t.stop_reason = ANY($2::text[])"
                "  AND NOT EXISTS (SELECT 1 FROM reaper.tasks r WHERE r.replaces = t.id)"
                " ORDER BY t.updated_at, t.id",
                service,
                REPLACEABLE_STOP_REASONS,
                states.ENDED_TASKS,
            )
        ]
        candidates = await placeable_load(conn)
        candidates.pop(exclude, None)  # type: ignore[arg-type]
        chosen: list[str | None] = list(place(candidates, missing))
        unplaced += missing - len(chosen)
        chosen += [None] * (missing - len(chosen))
        for i, worker in enumerate(chosen):
            replaces = unreplaced[i] if i < len(unreplaced) else None
            new_id = f"{service}-{uuid.uuid4().hex[:12]}"
            if not dry_run:
                await conn.execute(
                    "INSERT INTO reaper.tasks (id, service, worker, state, replaces)"
                    " VALUES ($1, $2, $3, $5, $4)",
                    new_id,
                    service,
                    worker,
                    replaces,
                    states.PLACED.value,
                )
            where = f"on {worker}" if worker else "owed: no healthy, non-draining worker"
            detail = f"{reason}; {where}" + (f", replaces {replaces}" if replaces else "")
            await write_events(
                conn, worker, "task", "replaced", [new_id], detail, actor, dry_run=dry_run
            )
            if worker is not None:
                placed.append((new_id, worker))
    return placed, unplaced


PLACEABLE_LOAD = (
    "SELECT w.name, (SELECT count(*) FROM reaper.tasks t WHERE t.worker = w.name"
    " AND t.state = ANY($1::text[])) AS load FROM reaper.workers w"
    " WHERE w.state = ANY($2::text[]) AND NOT w.draining ORDER BY w.name"
    " FOR KEY SHARE OF w SKIP LOCKED"
)
"""Placeable workers ($2, not draining) and their active tasks ($1), their rows locked
``FOR KEY SHARE`` until the caller's transaction ends; a worker whose row another
transaction holds ``FOR UPDATE`` is skipped, never waited on."""


async def placeable_load(conn: asyncpg.Connection) -> dict[str, int]:
    """Placeable workers (``states.PLACEABLE``, not draining; rule 5, §5.1) -> their
    pending and running task count, each worker's row locked until the caller's
    transaction ends.

    The lock (``FOR KEY SHARE``: beats' row refreshes are not held up) makes a placement
    and a change of the worker's state one after the other. A retirement, reap, state
    record or drain (each ``FOR UPDATE`` of the worker's row) that is under way leaves its
    worker out of this read (``SKIP LOCKED``: the placement goes elsewhere, or its task is
    owed and placed later); one that comes after waits for this transaction and sees the
    tasks placed here. Read without a lock, a retirement that committed between this read
    and the placement left tasks ``pending`` on a retired worker (the fleet timelines:
    ``retire, return, retire`` of a lone worker). Waiting instead of skipping deadlocked
    two transactions that each hold a worker and then place (two retirements at once, or
    a retirement and a reap sharing a service: review of ce50ddd)."""
    return {
        r["name"]: r["load"]
        for r in await conn.fetch(PLACEABLE_LOAD, states.ACTIVE_TASKS, states.PLACEABLE)
    }


async def take_down(
    conn: asyncpg.Connection,
    worker: str,
    stop_reason: str,
    reason: str,
    actor: str | None,
    *,
    dry_run: bool = False,
    taken: Sequence[str] = tuple(states.ACTIVE_TASKS),
) -> list[asyncpg.Record]:
    """Mark a worker's tasks in ``states`` ``lost`` with ``stop_reason``, one ``lost`` event
    each carrying ``reason``; in a dry run only the events (``would-lost``).

    Returns:
        The rows taken down (``id``, ``service``), ordered by id.
    """
    if dry_run:
        rows = await conn.fetch(
            "SELECT id, service FROM reaper.tasks WHERE worker = $1 AND state = ANY($2::text[])"
            " ORDER BY id",
            worker,
            list(taken),
        )
    else:
        rows = await conn.fetch(
            "UPDATE reaper.tasks SET state = $4, stop_reason = $2, missing_since = NULL"
            " WHERE worker = $1 AND state = ANY($3::text[]) RETURNING id, service",
            worker,
            stop_reason,
            list(taken),
            states.REAPED.value,
        )
        rows = sorted(rows, key=lambda r: r["id"])
    await write_events(
        conn, worker, "task", "lost", [r["id"] for r in rows], reason, actor, dry_run=dry_run
    )
    return rows


async def replace_tasks(
    conn: asyncpg.Connection,
    worker: str,
    stop_reason: str,
    reason: str,
    actor: str | None,
    backfill_reason: str,
    *,
    dry_run: bool = False,
) -> tuple[list[str], list[tuple[str, str]], int]:
    """Take a worker's running and pending tasks down (:func:`take_down`) and backfill their
    services (:func:`backfill`), never onto that worker: what reaps, retirements and stray
    reaping share.

    Returns:
        ``(task ids taken down, [(new_task_id, worker), ...] placed, owed count)``.
    """
    rows = await take_down(conn, worker, stop_reason, reason, actor, dry_run=dry_run)
    services = [r["service"] for r in rows]
    placed, owed = await backfill(
        conn,
        services,
        backfill_reason,
        actor,
        dry_run=dry_run,
        assume_inactive=services if dry_run else (),
        exclude=worker,
    )
    return [r["id"] for r in rows], placed, owed


async def place_owed(conn: asyncpg.Connection) -> list[tuple[str, str]]:
    """Place owed replacements (``pending``, no worker) on placeable workers, oldest first.

    Each placement is guarded (``worker IS NULL``), so a concurrent call places nothing
    twice; one ``placed`` event per task. Returns ``(task_id, worker)`` placed.
    """
    owed = [
        (r["id"], r["service"])
        for r in await conn.fetch(
            "SELECT id, service FROM reaper.tasks WHERE state = $1 AND worker IS NULL"
            " ORDER BY created_at, id FOR UPDATE SKIP LOCKED",
            states.PLACED.value,
        )
    ]
    if not owed:
        return []
    placed = []
    for task_id, worker in place_owed_policy(owed, await placeable_load(conn)):
        done = await conn.fetchval(
            "UPDATE reaper.tasks SET worker = $2 WHERE id = $1 AND state = $3"
            " AND worker IS NULL RETURNING id",
            task_id,
            worker,
            states.PLACED.value,
        )
        if done is not None:
            await write_events(conn, worker, "task", "placed", [task_id], "owed work placed")
            placed.append((task_id, worker))
    return placed
