"""What ``reaper demo`` observes in Postgres: a handle's mark and presence, its destroy, a
worker's state, a task, its replacement, a service's running tasks. Plain async functions
over an asyncpg pool or connection (:data:`reaper.cli.read.Db`); the controller never calls
them."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from reaper.cli.read import Db
from reaper.core import kinds, states
from reaper.core.states import TaskState


async def handle_missing_since(db: Db, kind: str, handle: str) -> datetime | None:
    """``missing_since`` of a row of ``kind`` (a report kind); ``None`` if unmarked or gone.

    Raises:
        ValueError: ``kind`` is not a kind of handle.
    """
    k = _handle_kind(kind)
    since: datetime | None = await db.fetchval(
        f"SELECT missing_since FROM {k.table} WHERE {k.key} = $1", handle
    )
    return since


async def handle_present(db: Db, kind: str, handle: str) -> tuple[datetime, bool]:
    """``(database clock now, whether the row exists)``, read in one statement so that the
    time and the presence belong together.

    Raises:
        ValueError: ``kind`` is not a kind of handle.
    """
    k = _handle_kind(kind)
    row = await db.fetchrow(
        f"SELECT now() AS now, EXISTS (SELECT 1 FROM {k.table} WHERE {k.key} = $1) AS present",
        handle,
    )
    return row["now"], bool(row["present"])


def _handle_kind(kind: str) -> kinds.Kind:
    """The kind ``kind`` names (a report kind); its table and key are fixed identifiers.

    Raises:
        ValueError: ``kind`` is not a report kind (``reaper.core.kinds.REPORTS``).
    """
    if kind not in kinds.REPORTS:
        raise ValueError(f"kind must be one of {kinds.REPORTS}, not {kind!r}")
    return kinds.kind(kind)


class EventRow(NamedTuple):
    """When an ``events`` row was written and its reason."""

    at: datetime
    reason: str | None


async def destroyed_event(db: Db, kind: str, handle: str) -> EventRow | None:
    """The ``destroyed`` events row of a handle; ``kind`` is the events kind (``container``,
    ``volume``). ``None`` if there is none."""
    row = await db.fetchrow(
        "SELECT at, reason FROM reaper.events WHERE kind = $1 AND handle = $2"
        " AND action = 'destroyed'",
        kind,
        handle,
    )
    return None if row is None else EventRow(row["at"], row["reason"])


async def worker_state(db: Db, name: str) -> str | None:
    """The ``workers`` row's state (``running``, ``stalled``, ``lost``, ``retired``), ``None``
    if none."""
    state: str | None = await db.fetchval("SELECT state FROM reaper.workers WHERE name = $1", name)
    return state


class TaskRow(NamedTuple):
    """A ``tasks`` row, the columns the shell shows."""

    id: str
    worker: str | None
    state: str
    stop_reason: str | None


async def task(db: Db, task_id: str) -> TaskRow | None:
    """Task ``task_id``, or ``None`` if there is no such row."""
    row = await db.fetchrow(
        "SELECT id, worker, state, stop_reason FROM reaper.tasks WHERE id = $1", task_id
    )
    return None if row is None else TaskRow(*row.values())


async def task_state(db: Db, task_id: str) -> str | None:
    """State of task ``task_id`` (``pending``, ``running``, ``lost``, ``stopped``), or ``None``."""
    state: str | None = await db.fetchval("SELECT state FROM reaper.tasks WHERE id = $1", task_id)
    return state


async def replacement_of(db: Db, task_id: str) -> TaskRow | None:
    """The task placed to replace ``task_id`` (its ``replaces``), or ``None`` so far."""
    row = await db.fetchrow(
        "SELECT id, worker, state, stop_reason FROM reaper.tasks WHERE replaces = $1", task_id
    )
    return None if row is None else TaskRow(*row.values())


async def running_tasks_of(db: Db, service: str) -> int:
    """How many tasks of ``service`` are ``running``."""
    return int(
        await db.fetchval(
            "SELECT count(*) FROM reaper.tasks WHERE service = $1 AND state = $2",
            service,
            TaskState.running.value,
        )
    )


async def active_tasks_of(db: Db, service: str) -> int:
    """How many tasks of ``service`` are active: ``pending`` (owed ones included) or
    ``running``."""
    return int(
        await db.fetchval(
            "SELECT count(*) FROM reaper.tasks WHERE service = $1 AND state = ANY($2::text[])",
            service,
            states.ACTIVE_TASKS,
        )
    )


async def running_tasks_on(db: Db, worker: str) -> list[str]:
    """Ids of the ``running`` tasks placed on ``worker``, sorted."""
    rows = await db.fetch(
        "SELECT id FROM reaper.tasks WHERE worker = $1 AND state = $2 ORDER BY id",
        worker,
        TaskState.running.value,
    )
    return [r["id"] for r in rows]
