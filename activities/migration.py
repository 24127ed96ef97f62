"""The migrating drain and drained workers (CONTRACT.md §6.1, §6.2), in SQL: what the fleet
monitor's upkeep does every ``HEARTBEAT_INTERVAL``, and what an ``undrain`` ends.

The rules are ``reaper.core.policy.migration``'s; each verb here reads the rows they need,
asks the policy and writes what it returns, inside its caller's transaction, each statement
guarded by the state it expects (a retry or a concurrent controller changes nothing twice;
one active replacement per task is also a unique index, migration 009).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from activities.base import write_events
from activities.tasks import backfill, placeable_load
from reaper.core import states
from reaper.core.policy import migration as policy
from reaper.core.policy.placement import place

ORIGINALS = (
    "SELECT o.id, o.service, o.worker, r.id AS replacement, r.state = $3 AS replacement_running"
    " FROM reaper.tasks o JOIN reaper.workers w ON w.name = o.worker"
    " LEFT JOIN reaper.tasks r ON r.replaces = o.id AND r.state = ANY($1::text[])"
    " WHERE w.draining AND w.migrate_until IS NOT NULL AND w.state = ANY($2::text[])"
    " AND o.state = $3 ORDER BY o.created_at, o.id FOR UPDATE OF o"
)
"""The running tasks ($3, ``states.STARTED``) of every migrating worker whose state lets it
run work ($2, ``states.DECIDING``), with their active ($1) replacement, oldest first."""
SERVICES = (
    "SELECT s.name, s.desired_count, s.max_surge,"
    " (SELECT count(*) FROM reaper.tasks t WHERE t.service = s.name"
    "  AND t.state = ANY($2::text[])) AS active"
    " FROM reaper.services s WHERE s.name = ANY($1::text[]) ORDER BY s.name FOR UPDATE OF s"
)
STOP = (
    "UPDATE reaper.tasks SET state = $3, stop_reason = $2, missing_since = NULL"
    " WHERE id = ANY($1::text[]) AND state = ANY($4::text[]) RETURNING id, worker, service"
)
"""Stop tasks ($1) still in $4 with ``stop_reason`` $2 (``states.DESTROYED``: ``stopped``)."""
MIGRATING = (
    "SELECT name, migrate_until FROM reaper.workers WHERE migrate_until IS NOT NULL"
    " ORDER BY name FOR UPDATE"
)
ON_WORKER = "SELECT id FROM reaper.tasks WHERE worker = $1 AND state = ANY($2::text[]) ORDER BY id"
END_MIGRATION = (
    "UPDATE reaper.workers SET migrate_since = NULL, migrate_until = NULL"
    " WHERE name = ANY($1::text[]) AND migrate_until IS NOT NULL"
)
DRAINED = (
    "UPDATE reaper.workers w SET drained_at = $1, migrate_since = NULL, migrate_until = NULL"
    " WHERE w.draining AND w.drained_at IS NULL AND w.state = ANY($2::text[])"
    " AND NOT EXISTS (SELECT 1 FROM reaper.tasks t WHERE t.worker = w.name"
    "  AND t.state = ANY($3::text[])) RETURNING w.name"
)
"""§6.2: a draining worker in a state that runs work ($2) holding no active task ($3) is
drained at $1; a migration it ran has ended."""
NOT_DRAINED = (
    "UPDATE reaper.workers w SET drained_at = NULL WHERE w.drained_at IS NOT NULL"
    " AND (NOT w.draining OR EXISTS (SELECT 1 FROM reaper.tasks t WHERE t.worker = w.name"
    "  AND t.state = ANY($1::text[]))) RETURNING w.name"
)
"""A drained worker that holds a task again (a scheduler wrote one) or drains no more."""

STARTED_REPLACEMENTS = (
    "SELECT EXISTS (SELECT 1 FROM reaper.tasks t JOIN reaper.tasks o ON o.id = t.replaces"
    " JOIN reaper.workers w ON w.name = o.worker"
    " WHERE t.id = ANY($1::text[]) AND w.draining AND w.migrate_until IS NOT NULL)"
)
"""Whether one of the tasks $1 replaces an original of a migrating worker."""


async def next_step_due(conn: asyncpg.Connection, started: list[str]) -> bool:
    """Whether a report that started the tasks ``started`` (ids now ``running``) made a
    migration's next step due: one of them is the replacement of a migrating worker's
    original, which may stop now (``policy.migration.replaced``), and the next wave follow.
    The caller wakes the fleet monitor's upkeep (``activities.changes.wake_upkeep``) rather
    than leave the step to its next tick (BENCHMARKS.md metrics 10a, 10b: about one heartbeat
    interval of each wave)."""
    return bool(started) and bool(await conn.fetchval(STARTED_REPLACEMENTS, started))


@dataclass
class MigrationStep:
    """What one upkeep's migration did.

    Attributes:
        placed: replacements placed (``(task_id, worker)``) and backfills after a deadline.
        drained: workers that became drained (§6.2): their livenesses are told.
        replaced: originals stopped because their replacement runs.
        deadline: tasks stopped at a deadline.

    The caller counts ``replaced`` and ``deadline`` (``reaper_migrations_total``) once its
    transaction has committed.
    """

    placed: list[tuple[str, str]] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    replaced: int = 0
    deadline: int = 0


async def migrate(conn: asyncpg.Connection, at: datetime, fleet_full: bool) -> MigrationStep:
    """One round of every migrating drain at ``at`` (the controller's time, UTC), then the
    drained workers: originals whose replacement runs stop; the deadlines that came stop what
    is left and backfill it; the next wave of replacements is placed; draining workers that
    hold nothing are drained. Runs in the caller's transaction.

    The migrating workers' rows are locked before their tasks, the order in which a
    retirement, a reap or an undrain of one takes them (its row, then its tasks): the other
    order deadlocked a rotation's upkeep with the retirement of the rotating worker (review
    of ce50ddd; a clean clone's fleet timelines, ``rotate 0 ... retire 0``)."""
    step = MigrationStep()
    migrating = await conn.fetch(MIGRATING)
    step.replaced = len(await stop_replaced(conn, None))
    for row in migrating:
        if policy.deadline_passed(row["migrate_until"], at, fleet_full):
            stopped, placed = await stop_at_deadline(conn, row["name"])
            step.deadline += stopped
            step.placed += placed
    step.placed += await place_wave(conn)
    step.drained = await mark_drained(conn, at)
    return step


async def originals(conn: asyncpg.Connection) -> list[tuple[str, policy.Original]]:
    """Every running task of every migrating worker, with its worker, oldest first."""
    rows = await conn.fetch(ORIGINALS, states.ACTIVE_TASKS, states.DECIDING, states.STARTED.value)
    return [
        (
            r["worker"],
            policy.Original(
                r["id"], r["service"], r["replacement"], bool(r["replacement_running"])
            ),
        )
        for r in rows
    ]


async def stop_replaced(conn: asyncpg.Connection, worker: str | None) -> list[str]:
    """Stop the originals (of ``worker``, or of every migrating worker) whose replacement
    runs (``stop_reason`` drained, ``policy.migration.replaced``); one ``stopped`` event
    each, naming the replacement. Returns their ids."""
    found = [(w, o) for w, o in await originals(conn) if worker is None or w == worker]
    due = set(policy.replaced([o for _, o in found]))
    rows = await conn.fetch(
        STOP, sorted(due), policy.DRAINED, states.DESTROYED.value, [states.STARTED.value]
    )
    by_id = {o.task: o for _, o in found}
    for r in rows:
        await write_events(
            conn,
            r["worker"],
            "task",
            "stopped",
            [r["id"]],
            f"{policy.DRAINED}: its replacement {by_id[r['id']].replacement} runs",
            "reaper",
        )
    return [r["id"] for r in rows]


async def place_wave(conn: asyncpg.Connection) -> list[tuple[str, str]]:
    """Place the next replacements of every migrating drain (``policy.migration.wave``), each
    on the least loaded placeable worker; one left unplaced (no capacity) is tried again at
    the next upkeep. One ``replaced`` event each, its reason starting ``migrate``."""
    found = await originals(conn)
    names = sorted({o.service for _, o in found if o.service is not None})
    if not names:
        return []
    loads = {
        r["name"]: policy.ServiceLoad(r["desired_count"], r["max_surge"], r["active"])
        for r in await conn.fetch(SERVICES, names, states.ACTIVE_TASKS)
    }
    chosen = set(policy.wave([o for _, o in found], loads))
    placed: list[tuple[str, str]] = []
    for worker, o in found:
        if o.task not in chosen:
            continue
        targets = place(await placeable_load(conn), 1)
        if not targets:
            break  # no capacity: the next upkeep tries again (§6.1)
        new_id = f"{o.service}-{uuid.uuid4().hex[:12]}"
        inserted = await conn.fetchval(
            "INSERT INTO reaper.tasks (id, service, worker, state, replaces)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING id",
            new_id,
            o.service,
            targets[0],
            states.PLACED.value,
            o.task,
        )
        if inserted is None:
            continue
        await write_events(
            conn,
            targets[0],
            "task",
            "replaced",
            [new_id],
            f"{policy.REASON_PREFIX}: drain of {worker}; on {targets[0]}, replaces {o.task}",
            "reaper",
        )
        placed.append((new_id, targets[0]))
    return placed


async def stop_at_deadline(
    conn: asyncpg.Connection, worker: str
) -> tuple[int, list[tuple[str, str]]]:
    """A migrating drain's deadline came: every ``pending`` or ``running`` task still on
    ``worker`` stops (``stop_reason`` drain-deadline, one ``stopped`` event each) and its
    service is backfilled as after a loss (owed if no worker can take it; a replacement
    already placed counts); the migration ends. Returns ``(tasks stopped, placed)``."""
    ids = [r["id"] for r in await conn.fetch(ON_WORKER, worker, states.ACTIVE_TASKS)]
    rows = await conn.fetch(STOP, ids, policy.DEADLINE, states.DESTROYED.value, states.ACTIVE_TASKS)
    await write_events(
        conn,
        worker,
        "task",
        "stopped",
        sorted(r["id"] for r in rows),
        f"{policy.DEADLINE}: still on {worker} at its drain's deadline",
        "reaper",
    )
    placed, _ = await backfill(
        conn, [r["service"] for r in rows], f"drain deadline of {worker}", "reaper", exclude=worker
    )
    await conn.execute(END_MIGRATION, [worker])
    return len(rows), placed


async def mark_drained(conn: asyncpg.Connection, at: datetime) -> list[str]:
    """Draining workers that hold no ``pending`` or ``running`` task become drained at ``at``
    (§6.2: ``workers.drained_at``, one ``drained`` event each); drained workers that hold a
    task again are drained no more. Returns the workers newly drained."""
    await conn.execute(NOT_DRAINED, states.ACTIVE_TASKS)
    names = [r["name"] for r in await conn.fetch(DRAINED, at, states.DECIDING, states.ACTIVE_TASKS)]
    for name in names:
        await write_events(
            conn, name, "worker", "drained", [name], "holds no pending or running task", "reaper"
        )
    return names


async def cancel(conn: asyncpg.Connection, worker: str) -> tuple[list[str], list[str]]:
    """An ``undrain`` ends ``worker``'s migration (§6.1): its replacements not yet running
    stop (``stop_reason`` undrained), an original whose replacement runs stops as it would
    have (drained), the others keep running; each service ends at ``desired_count``.
    Returns ``(replacements stopped, originals stopped)``."""
    found = [o for w, o in await originals(conn) if w == worker]
    pending = sorted(o.replacement for o in found if o.migrating and o.replacement)
    rows = await conn.fetch(
        STOP, pending, policy.UNDRAINED, states.DESTROYED.value, [states.PLACED.value]
    )
    await write_events(
        conn,
        None,
        "task",
        "stopped",
        sorted(r["id"] for r in rows),
        f"{policy.UNDRAINED}: the drain of {worker} ended before it ran",
        "reaper",
    )
    stopped = await stop_replaced(conn, worker)
    await conn.execute(END_MIGRATION, [worker])
    return [r["id"] for r in rows], stopped
