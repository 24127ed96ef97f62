"""What ``reaper explain`` reads from Postgres: the facts the explanations are built from
(``reaper.core.policy.explain``). Read-only, one connection, plain parameterised SQL."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from reaper.core import states
from reaper.core.contract import KINDS
from reaper.core.policy.explain import Event, FleetFacts, RowFacts, WorkerFacts

TABLE = {"container": "reaper.containers", "volume": "reaper.volumes"}
"""The handle tables by the kind ``reaper explain`` names (a fixed map, never input)."""


async def worker_facts(conn: asyncpg.Connection, name: str) -> WorkerFacts | None:
    """The ``workers`` row of ``name``, or ``None``."""
    r = await conn.fetchrow(
        "SELECT name, state, state_since, last_heartbeat_at, draining, reaped_at, boot_id,"
        " containers_complete_at, volumes_complete_at, tasks_complete_at, created_at"
        " FROM reaper.workers WHERE name = $1",
        name,
    )
    if r is None:
        return None
    return WorkerFacts(
        name=r["name"],
        state=r["state"],
        state_since=r["state_since"],
        last_heartbeat_at=r["last_heartbeat_at"],
        draining=r["draining"],
        reaped_at=r["reaped_at"],
        boot_id=r["boot_id"],
        complete_at={kind: r[f"{kind}_complete_at"] for kind in KINDS},
        row_heartbeat_at=r["last_heartbeat_at"],
        created_at=r["created_at"],
    )


async def fleet_facts(conn: asyncpg.Connection) -> FleetFacts:
    """The fleet row with its counts (``states.HEALTHY`` and ``states.UNHEALTHY``)."""
    r = await conn.fetchrow(
        "SELECT f.state, f.recovered_at,"
        " (SELECT count(*) FROM reaper.workers WHERE state = ANY($1::text[])) AS healthy,"
        " (SELECT count(*) FROM reaper.workers WHERE state = ANY($2::text[])) AS unhealthy"
        " FROM reaper.fleet f WHERE f.id = 1",
        states.HEALTHY,
        states.UNHEALTHY,
    )
    if r is None:
        return FleetFacts()
    return FleetFacts(r["state"], r["healthy"], r["unhealthy"], r["recovered_at"])


async def row_facts(conn: asyncpg.Connection, kind: str, handle: str) -> RowFacts | None:
    """A container's, volume's (``kind`` ``container``/``volume``) or task's (``task``) row.

    Raises:
        ValueError: ``kind`` is none of those.
    """
    if kind == "task":
        r = await conn.fetchrow(
            "SELECT t.id, t.worker, t.state, t.missing_since, t.state_changed_at, t.stop_reason,"
            " t.service, (SELECT min(r.id) FROM reaper.tasks r WHERE r.replaces = t.id) AS by"
            " FROM reaper.tasks t WHERE t.id = $1",
            handle,
        )
        if r is None:
            return None
        return RowFacts(
            "task",
            r["id"],
            r["worker"],
            r["state"],
            r["missing_since"],
            r["state_changed_at"],
            r["stop_reason"],
            r["service"],
            r["by"],
        )
    if kind not in TABLE:
        raise ValueError(f"kind must be container, volume or task, not {kind!r}")
    r = await conn.fetchrow(
        f"SELECT handle, worker, state, missing_since, state_changed_at FROM {TABLE[kind]}"
        " WHERE handle = $1",
        handle,
    )
    return RowFacts(kind, *r.values()) if r is not None else None


async def events_of(
    conn: asyncpg.Connection, kind: str, handle: str, limit: int = 10
) -> list[Event]:
    """The newest ``limit`` events of one container, volume, task or worker, oldest first."""
    rows = await conn.fetch(
        "SELECT at, action, reason FROM (SELECT id, at, action, reason FROM reaper.events"
        " WHERE kind = $1 AND handle = $2 ORDER BY id DESC LIMIT $3) e ORDER BY id",
        kind,
        handle,
        limit,
    )
    return [(r["at"], r["action"], r["reason"]) for r in rows]


async def database_now(conn: asyncpg.Connection) -> datetime:
    """Postgres' clock, UTC: the explanations are judged on it, as the gauges are."""
    at: datetime = await conn.fetchval("SELECT now()")
    return at


async def kinds_named(conn: asyncpg.Connection, name: str) -> list[str]:
    """The kinds (``worker``, ``container``, ``volume``, ``task``, in that order) that have a
    row named ``name``; if none has, the kinds its events name (a thing gone), oldest first."""
    r = await conn.fetchrow(
        "SELECT EXISTS (SELECT 1 FROM reaper.workers WHERE name = $1) AS worker,"
        " EXISTS (SELECT 1 FROM reaper.containers WHERE handle = $1) AS container,"
        " EXISTS (SELECT 1 FROM reaper.volumes WHERE handle = $1) AS volume,"
        " EXISTS (SELECT 1 FROM reaper.tasks WHERE id = $1) AS task",
        name,
    )
    found = [kind for kind in ("worker", "container", "volume", "task") if r[kind]]
    if found:
        return found
    rows = await conn.fetch(
        "SELECT kind FROM reaper.events WHERE handle = $1 GROUP BY kind ORDER BY min(id)", name
    )
    return [row["kind"] for row in rows]
