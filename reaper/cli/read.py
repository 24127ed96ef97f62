"""The shell's read model: every SQL statement of ``reaper workers``, ``events``,
``try-scheduler`` and ``demo`` (their writes, a stand-in scheduler's, are
:mod:`reaper.cli.scheduler`'s).

The controller never calls these. They are plain async functions over an asyncpg pool or
connection (both have ``fetch``/``fetchrow``/``fetchval``/``execute``), so that the shell
(:mod:`reaper.cli`) needs no SQL of its own.
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple, TypeAlias

import asyncpg

from reaper.core import kinds, states
from reaper.core.policy.explain_drain import MigrationFacts
from reaper.core.states import TaskState

Db: TypeAlias = asyncpg.Pool | asyncpg.Connection
"""Anything that runs a statement: a pool (one connection per call) or one connection."""


async def open_connection(url: str, *, timeout_s: float = 5.0) -> asyncpg.Connection:
    """One connection to ``url`` (``postgresql://...``), a single attempt of ``timeout_s``
    seconds; the caller closes it.

    Raises:
        OSError, asyncio.TimeoutError, asyncpg.PostgresError: unreachable or refused.
    """
    return await asyncpg.connect(url, timeout=timeout_s)


async def running_task_counts(db: Db) -> dict[str, int]:
    """Running tasks per worker: ``{worker: count}``; workers with none are absent."""
    rows = await db.fetch(
        "SELECT worker, count(*) AS n FROM reaper.tasks WHERE state = $1 GROUP BY worker",
        TaskState.running.value,
    )
    return {r["worker"]: int(r["n"]) for r in rows}


class ReportTimes(NamedTuple):
    """A worker's row as ``policy.reports.liveness_only`` judges it: state, last heartbeat,
    per kind the last complete report (``workers.<kind>_complete_at``), when the row was
    made, and when the worker was drained (§6.2; ``None``: not drained). Times UTC; the row
    may lag the liveness by up to ``STALL_AFTER`` (§5.3), and lead it on ``drained_at``: the
    tasks reconcile writes that here before it tells the liveness.
    """

    state: str
    last_heartbeat_at: datetime | None
    complete_at: dict[str, datetime | None]
    created_at: datetime
    drained_at: datetime | None = None


async def report_times(db: Db) -> dict[str, ReportTimes]:
    """Every worker's :class:`ReportTimes`, by name."""
    rows = await db.fetch(
        f"SELECT name, state, last_heartbeat_at, {kinds.COMPLETE_COLUMNS}, created_at,"
        " drained_at FROM reaper.workers"
    )
    return {
        r["name"]: ReportTimes(
            r["state"],
            r["last_heartbeat_at"],
            kinds.complete_times(r),
            r["created_at"],
            r["drained_at"],
        )
        for r in rows
    }


class ServiceState(NamedTuple):
    """A service as a scheduler reads it before placing: its ``desired_count``, its active
    tasks (``states.ACTIVE_TASKS``: pending, owed included, or running) and every task id of
    the form ``<service>-<n>`` taken by any task, whatever its state."""

    desired_count: int
    active: list[str]
    numbered: set[str]


async def service_state(db: Db, service: str, lock: bool = False) -> ServiceState | None:
    """``service``'s :class:`ServiceState`, ``None`` if it does not exist; with ``lock``, its
    row is locked (``FOR UPDATE``) until the caller's transaction ends."""
    desired = await db.fetchval(
        "SELECT desired_count FROM reaper.services WHERE name = $1"
        + (" FOR UPDATE" if lock else ""),
        service,
    )
    if desired is None:
        return None
    active = await db.fetch(
        "SELECT id FROM reaper.tasks WHERE service = $1 AND state = ANY($2::text[]) ORDER BY id",
        service,
        states.ACTIVE_TASKS,
    )
    numbered = await db.fetch(
        "SELECT id FROM reaper.tasks WHERE starts_with(id, $1)", f"{service}-"
    )
    return ServiceState(int(desired), [r["id"] for r in active], {r["id"] for r in numbered})


class FleetRow(NamedTuple):
    """The fleet's disruption state (``normal``, ``partial``, ``full``) and since when."""

    state: str
    since: datetime


async def fleet_state(db: Db) -> FleetRow | None:
    """The controller's fleet row, or ``None`` before the controller wrote one."""
    row = await db.fetchrow("SELECT state, since FROM reaper.fleet WHERE id = 1")
    return None if row is None else FleetRow(row["state"], row["since"])


class RetiredWorker(NamedTuple):
    """A ``workers`` row in state ``retired``: the columns ``reaper workers --all`` shows."""

    name: str
    boot_id: str | None
    last_seq: int | None
    last_heartbeat_at: datetime | None
    retired_at: datetime


async def retired_workers(db: Db) -> list[RetiredWorker]:
    """Workers out of the fleet (``states.TERMINAL``: retired, CONTRACT.md §5.1), by name."""
    rows = await db.fetch(
        "SELECT name, boot_id, last_seq, last_heartbeat_at, state_since FROM reaper.workers"
        " WHERE state = ANY($1::text[]) ORDER BY name",
        states.TERMINAL,
    )
    return [RetiredWorker(*r.values()) for r in rows]


async def schema_ready(db: Db) -> bool:
    """True once the controller has migrated the schema (table ``reaper.fleet`` exists)."""
    return await db.fetchval("SELECT to_regclass('reaper.fleet')::text") is not None


class PlacedTask(NamedTuple):
    """A ``pending`` or ``running`` task and where it is placed (``worker`` ``None``: owed)."""

    id: str
    service: str | None
    worker: str | None
    state: str
    since: datetime


async def active_tasks(db: Db) -> list[PlacedTask]:
    """Every ``pending`` or ``running`` task with its worker and since when it is in its
    state, by worker (owed ones last), then id."""
    rows = await db.fetch(
        "SELECT id, service, worker, state, COALESCE(state_changed_at, created_at)"
        " FROM reaper.tasks WHERE state IN ('pending', 'running')"
        " ORDER BY worker NULLS LAST, id"
    )
    return [PlacedTask(*r.values()) for r in rows]


# ---- the events timeline (``reaper events``) ---------------------------------------------


class Event(NamedTuple):
    """An ``events`` row (CONTRACT.md §3): one destroy, stop, reap, replacement, state change,
    drain or orphan."""

    id: int
    at: datetime
    worker: str | None
    kind: str
    handle: str | None
    action: str
    reason: str | None
    actor: str | None


async def events(
    db: Db,
    *,
    worker: str | None = None,
    kind: str | None = None,
    action: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    after_id: int = 0,
    limit: int | None = None,
) -> list[Event]:
    """``events`` rows matching every filter given (``None``: any), oldest first.

    Args:
        since, until: bounds on ``at`` (inclusive, timezone-aware).
        after_id: only rows with a larger ``id`` (``--follow`` passes the last one seen).
        limit: at most this many rows, the newest ones (still returned oldest first).
    """
    rows = await db.fetch(
        "SELECT * FROM (SELECT id, at, worker, kind, handle, action, reason, actor"
        " FROM reaper.events WHERE id > $1"
        " AND ($2::text IS NULL OR worker = $2) AND ($3::text IS NULL OR kind = $3)"
        " AND ($4::text IS NULL OR action = $4)"
        " AND ($5::timestamptz IS NULL OR at >= $5) AND ($6::timestamptz IS NULL OR at <= $6)"
        " ORDER BY id DESC LIMIT $7) AS e ORDER BY id",
        after_id,
        worker,
        kind,
        action,
        since,
        until,
        limit,
    )
    return [Event(*r.values()) for r in rows]


async def event_ids_after(db: Db, after_id: int, limit: int = 100_000) -> list[int]:
    """The ids of every ``events`` row above ``after_id`` (any kind), ascending: what has
    committed so far (``reaper.cli.follow``)."""
    rows = await db.fetch(
        "SELECT id FROM reaper.events WHERE id > $1 ORDER BY id LIMIT $2", after_id, limit
    )
    return [r["id"] for r in rows]


async def running_workers(db: Db) -> list[str]:
    """Names of the workers a scheduler may place tasks on now: placeable
    (``states.PLACEABLE``: running), not draining."""
    rows = await db.fetch(
        "SELECT name FROM reaper.workers WHERE state = ANY($1::text[]) AND NOT draining"
        " ORDER BY name",
        states.PLACEABLE,
    )
    return [r["name"] for r in rows]


# ---- a migrating drain, as `reaper drain --wait` and `reaper explain` show it ------------


class DrainRow(NamedTuple):
    """A worker's drain: ``draining``, the migration's deadline (UTC) and ``drained_at``."""

    draining: bool
    migrate_until: datetime | None
    drained_at: datetime | None


async def drain_state(db: Db, worker: str) -> DrainRow | None:
    """The worker's drain as Postgres holds it; ``None`` for an unknown worker."""
    row = await db.fetchrow(
        "SELECT draining, migrate_until, drained_at FROM reaper.workers WHERE name = $1", worker
    )
    return DrainRow(row["draining"], row["migrate_until"], row["drained_at"]) if row else None


async def migration_rows(db: Db, worker: str, since: datetime | None) -> list[MigrationFacts]:
    """The tasks of ``worker`` that were active at ``since`` (UTC; every task of it still
    active, or stopped since then) with their newest replacement, oldest first, as the
    explanation of a drain takes them (``policy.explain_drain``)."""
    rows = await db.fetch(
        "SELECT o.id, o.state, o.stop_reason, r.id AS rid, r.worker AS rworker,"
        " r.state AS rstate FROM reaper.tasks o LEFT JOIN LATERAL (SELECT id, worker, state"
        "  FROM reaper.tasks WHERE replaces = o.id ORDER BY created_at DESC, id LIMIT 1) r"
        "  ON true"
        " WHERE o.worker = $1 AND (o.state = ANY($2::text[])"
        "  OR ($3::timestamptz IS NOT NULL AND o.updated_at >= $3))"
        " ORDER BY o.created_at, o.id",
        worker,
        states.ACTIVE_TASKS,
        since,
    )
    return [
        MigrationFacts(r["id"], r["state"], r["stop_reason"], r["rid"], r["rworker"], r["rstate"])
        for r in rows
    ]
