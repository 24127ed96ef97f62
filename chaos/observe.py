"""What the checker reads from Postgres at every step, kept as time series.

Each read is its own statement on a session that waits at most ``lock_timeout`` 300 ms for
a lock, so a table locked by a fault blinds the checker to that table only. Every
observation carries the instants just before and just after its statement (its snapshot
lies between), which is what the conservative rules in ``chaos.rules`` need.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from chaos.rules import Seen
from chaos.scheduler import DB_ERRORS
from reaper.core import kinds

EPOCH = "extract(epoch FROM {})::float8"

WORKERS = (
    f"SELECT name, state, {EPOCH.format('state_since')} AS since, draining FROM reaper.workers"
)
FLEET = (
    f"SELECT state, {EPOCH.format('since')} AS since,"
    f" {EPOCH.format('recovered_at')} AS recovered FROM reaper.fleet WHERE id = 1"
)
MARKS = " UNION ALL ".join(
    f"SELECT '{k.report}' AS kind, {k.key} AS handle, state,"
    f" {EPOCH.format('missing_since')} AS m FROM {k.table} WHERE missing_since IS NOT NULL"
    for k in kinds.ALL
)
TASKS = "SELECT id, service, worker, state FROM reaper.tasks"
SERVICES = (
    "SELECT s.name, s.desired_count, s.max_surge,"
    " count(t.id) FILTER (WHERE t.state IN ('pending', 'running')) AS active,"
    " count(t.id) FILTER (WHERE t.state = 'running' AND w.migrate_until IS NOT NULL)"
    " AS migrating"
    " FROM reaper.services s LEFT JOIN reaper.tasks t ON t.service = s.name"
    " LEFT JOIN reaper.workers w ON w.name = t.worker GROUP BY s.name"
)
"""Per service: its counts, its active tasks, and those running on a worker whose migrating
drain runs (CONTRACT.md §6.1), in one statement (one snapshot)."""
EVENTS = (
    f"SELECT id, {EPOCH.format('at')} AS at, worker, kind, handle, action, reason, actor"
    " FROM reaper.events WHERE id > $1 ORDER BY id"
)
EVENTS_LOOKBACK = 1000
"""Event ids come from a sequence at insert time, so a slow transaction can commit an id
below ones already read: every read looks this far back again (deduplicated by id)."""


@dataclass(frozen=True)
class Event:
    """A ``reaper.events`` row."""

    id: int
    at: float
    worker: str | None
    kind: str
    handle: str | None
    action: str
    reason: str
    actor: str | None


@dataclass
class Observations:
    """Everything read so far."""

    workers: dict[str, list[Seen[tuple[str, float]]]] = field(default_factory=dict)
    """Per worker: ``(state, state_since)``."""
    returns: dict[str, set[float]] = field(default_factory=dict)
    """Per worker: every ``state_since`` seen while ``running`` (registrations, returns)."""
    draining: dict[str, bool] = field(default_factory=dict)
    fleet: list[Seen[tuple[str, float]]] = field(default_factory=list)
    """``(state, since)`` of the fleet's disruption state."""
    recoveries: set[float] = field(default_factory=set)
    """Every ``recovered_at`` seen: when the fleet left full disruption."""
    marks: dict[tuple[str, str], float] = field(default_factory=dict)
    """``(kind, handle)`` -> the latest ``missing_since`` seen."""
    marked_creating: list[tuple[str, str, float]] = field(default_factory=list)
    tasks: dict[str, tuple[str | None, str | None, str]] = field(default_factory=dict)
    """Task id -> ``(service, worker, state)`` as last seen."""
    task_history: dict[str, list[str]] = field(default_factory=dict)
    """Task id -> the distinct states seen, in order."""
    services: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    """Service -> ``(desired_count, max_surge, active, migrating)`` as last seen (one
    snapshot; ``migrating``: its tasks running on workers whose migration runs)."""
    services_at: float = 0.0
    events: dict[int, Event] = field(default_factory=dict)
    first_seen: dict[int, float] = field(default_factory=dict)
    """Event id -> an instant by which it was committed (after the read that saw it)."""
    max_event: int = 0
    reads: int = 0
    failed_reads: int = 0


async def _read(pool: asyncpg.Pool, statement: str, *args: Any) -> tuple[float, float, list[Any]]:
    before = time.time()
    rows = await pool.fetch(statement, *args)
    return before, time.time(), rows


async def observe(pool: asyncpg.Pool, obs: Observations) -> None:
    """One step of reads; a read that fails (Postgres down, a table locked) is skipped."""
    for reader in (_workers, _fleet, _marks, _tasks, _services, _events):
        obs.reads += 1
        try:
            await reader(pool, obs)
        except DB_ERRORS:
            obs.failed_reads += 1


async def _workers(pool: asyncpg.Pool, obs: Observations) -> None:
    before, after, rows = await _read(pool, WORKERS)
    for r in rows:
        obs.workers.setdefault(r["name"], []).append(Seen(before, after, (r["state"], r["since"])))
        obs.draining[r["name"]] = r["draining"]
        if r["state"] == "running":
            obs.returns.setdefault(r["name"], set()).add(r["since"])


async def _fleet(pool: asyncpg.Pool, obs: Observations) -> None:
    before, after, rows = await _read(pool, FLEET)
    for r in rows:
        obs.fleet.append(Seen(before, after, (r["state"], r["since"])))
        if r["recovered"] is not None:
            obs.recoveries.add(r["recovered"])


async def _marks(pool: asyncpg.Pool, obs: Observations) -> None:
    _, after, rows = await _read(pool, MARKS)
    for r in rows:
        obs.marks[(r["kind"], r["handle"])] = r["m"]
        if r["state"] == "creating":
            obs.marked_creating.append((r["kind"], r["handle"], after))


async def _tasks(pool: asyncpg.Pool, obs: Observations) -> None:
    _, _, rows = await _read(pool, TASKS)
    for r in rows:
        obs.tasks[r["id"]] = (r["service"], r["worker"], r["state"])
        seen = obs.task_history.setdefault(r["id"], [])
        if not seen or seen[-1] != r["state"]:
            seen.append(r["state"])


async def _services(pool: asyncpg.Pool, obs: Observations) -> None:
    _, after, rows = await _read(pool, SERVICES)
    obs.services = {
        r["name"]: (r["desired_count"], r["max_surge"], r["active"], r["migrating"]) for r in rows
    }
    obs.services_at = after


async def _events(pool: asyncpg.Pool, obs: Observations) -> None:
    _, after, rows = await _read(pool, EVENTS, max(obs.max_event - EVENTS_LOOKBACK, 0))
    for r in rows:
        if r["id"] in obs.events:
            continue
        obs.events[r["id"]] = Event(
            r["id"],
            r["at"],
            r["worker"],
            r["kind"],
            r["handle"],
            r["action"],
            r["reason"] or "",
            r["actor"],
        )
        obs.first_seen[r["id"]] = after
        obs.max_event = max(obs.max_event, r["id"])
