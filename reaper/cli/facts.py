"""What ``reaper explain`` reads from Postgres: the facts the explanations are built from
(``reaper.core.policy.explain``). Read-only, one connection, plain parameterised SQL."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from reaper.core import kinds, states
from reaper.core.policy.explain import Event, FleetFacts, RowFacts, WorkerFacts

TABLE = {k.word: k.table for k in kinds.HANDLE_ROWS}
"""The handle tables by the kind ``reaper explain`` names (``reaper.core.kinds``: fixed
identifiers, never input)."""


async def worker_facts(conn: asyncpg.Connection, name: str) -> WorkerFacts | None:
    """The ``workers`` row of ``name``, or ``None``."""
    r = await conn.fetchrow(
        "SELECT name, state, state_since, last_heartbeat_at, draining, reaped_at, boot_id,"
        f" {kinds.COMPLETE_COLUMNS}, created_at FROM reaper.workers WHERE name = $1",
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
        complete_at=kinds.complete_times(r),
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
    """A handle's row (``kind`` a word of ``kinds.HANDLE_ROWS``: ``container``, ``volume``)
    or a task's (``task``).

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
        raise ValueError(f"kind must be one of {', '.join(kinds.WORDS)}, not {kind!r}")
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


_KINDS_NAMED = "SELECT EXISTS (SELECT 1 FROM reaper.workers WHERE name = $1) AS worker, " + (
    ", ".join(f"EXISTS (SELECT 1 FROM {k.table} WHERE {k.key} = $1) AS {k.word}" for k in kinds.ALL)
)
"""Whether the worker, or a row of each kind, is named $1 (fixed identifiers, never input)."""


async def kinds_named(conn: asyncpg.Connection, name: str) -> list[str]:
    """The kinds (``worker``, then the words of ``reaper.core.kinds``, in that order) that have
    a row named ``name``; if none has, the kinds its events name (a thing gone), oldest first."""
    r = await conn.fetchrow(_KINDS_NAMED, name)
    found = [kind for kind in ("worker", *kinds.WORDS) if r[kind]]
    if found:
        return found
    rows = await conn.fetch(
        "SELECT kind FROM reaper.events WHERE handle = $1 GROUP BY kind ORDER BY min(id)", name
    )
    return [row["kind"] for row in rows]
