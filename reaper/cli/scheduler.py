"""A stand-in scheduler's writes: what a user's scheduler would write (CONTRACT.md §3:
``services``, ``tasks``, ``containers``, ``volumes``), for ``reaper try-scheduler`` and the
demo. The controller never calls these."""

from __future__ import annotations

from reaper.cli.read import Db
from reaper.core import kinds, states
from reaper.core.states import HandleState


async def add_service(db: Db, name: str, desired_count: int) -> None:
    """Insert service ``name`` wanting ``desired_count`` running tasks.

    Raises:
        asyncpg.UniqueViolationError: the service exists.
    """
    await db.execute(
        "INSERT INTO reaper.services (name, desired_count) VALUES ($1, $2)", name, desired_count
    )


async def set_desired_count(db: Db, name: str, desired_count: int) -> None:
    """Make service ``name`` want ``desired_count`` tasks (a scheduler scaling it)."""
    await db.execute(
        "UPDATE reaper.services SET desired_count = $2 WHERE name = $1", name, desired_count
    )


async def add_handle(db: Db, kind: str, handle: str, worker: str) -> None:
    """Insert a ``created`` row for ``handle`` on ``worker`` of ``kind`` (a report kind
    whose rows have handle states: ``containers``, ``volumes``).

    Raises:
        ValueError: ``kind`` is not such a kind.
        asyncpg.UniqueViolationError: the handle exists.
    """
    rows = {k.report: k for k in kinds.HANDLE_ROWS}
    if kind not in rows:
        raise ValueError(f"kind must be one of {tuple(rows)}, not {kind!r}")
    k = rows[kind]
    await db.execute(
        f"INSERT INTO {k.table} ({k.key}, worker, state) VALUES ($1, $2, $3)",
        handle,
        worker,
        HandleState.created.value,
    )


async def add_task(db: Db, task_id: str, service: str, worker: str) -> None:
    """Insert task ``task_id`` of ``service``, ``pending`` and placed on ``worker``.

    Raises:
        asyncpg.UniqueViolationError: the task exists.
    """
    await db.execute(
        "INSERT INTO reaper.tasks (id, service, worker, state) VALUES ($1, $2, $3, $4)",
        task_id,
        service,
        worker,
        states.PLACED.value,
    )
