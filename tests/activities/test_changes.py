"""The change feed's triggers (migration 007) against real Postgres: which writes to the
handle tables ask for a diff (``reaper.row_changes``), and which do not.

A row the scheduler inserts, deletes, moves or changes the state of is a change for its
worker (and, for a move, for both workers); an update of other columns is not, nor is any
write of the collector's own (``reconcile_report``, ``destroy_missing``), which follows a
diff already. One row per statement and worker, so a large insert stays one change.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from activities import ReaperActivities
from activities.changes import BATCH, TAKE
from activities.types import DestroyInput, ReconcileInput
from tests.support.controller import make_settings
from tests.support.scheduler import insert
from tests.support.sealed import sealed


async def changes(pool: asyncpg.Pool) -> list[tuple[str, str]]:
    """The changes recorded so far, taken as the fleet monitor takes them."""
    rows = await pool.fetch(TAKE, BATCH)
    return sorted((r["worker"], r["kind"]) for r in rows)


@pytest.mark.parametrize("table", ["containers", "volumes"])
async def test_scheduler_writes_to_handle_rows_are_changes(pool: asyncpg.Pool, table) -> None:
    await pool.execute(
        f"INSERT INTO reaper.{table} (handle, worker, state)"
        " SELECT 'h-' || i, 'w' || (i % 2), 'creating' FROM generate_series(1, 100) AS i"
    )
    assert await changes(pool) == [("w0", table), ("w1", table)]  # one per statement and worker

    await pool.execute(f"UPDATE reaper.{table} SET updated_at = now() WHERE worker = 'w0'")
    assert await changes(pool) == []  # neither state nor worker changed

    await pool.execute(f"UPDATE reaper.{table} SET state = 'created' WHERE handle = 'h-2'")
    assert await changes(pool) == [("w0", table)]

    await pool.execute(f"UPDATE reaper.{table} SET worker = 'w9' WHERE handle = 'h-1'")
    assert await changes(pool) == [("w1", table), ("w9", table)]  # from and to

    await pool.execute(f"DELETE FROM reaper.{table} WHERE handle = 'h-3'")
    assert await changes(pool) == [("w1", table)]


async def test_scheduler_writes_to_tasks_are_changes(pool: asyncpg.Pool) -> None:
    await pool.execute(
        "INSERT INTO reaper.tasks (id, worker, state) VALUES ('t-1', 'w1', 'pending')"
    )
    await pool.execute("INSERT INTO reaper.tasks (id, state) VALUES ('t-owed', 'pending')")
    assert await changes(pool) == [("w1", "tasks")]  # an owed task has no worker yet
    await pool.execute("UPDATE reaper.tasks SET worker = 'w2' WHERE id = 't-owed'")
    assert await changes(pool) == [("w2", "tasks")]
    await pool.execute("UPDATE reaper.tasks SET state = 'running' WHERE id = 't-1'")
    assert await changes(pool) == [("w1", "tasks")]


async def test_a_change_not_yet_committed_is_taken_after_its_commit(
    db_url: str, pool: asyncpg.Pool
) -> None:
    writer = await asyncpg.connect(db_url)
    try:
        tx = writer.transaction()
        await tx.start()
        await writer.execute("INSERT INTO reaper.containers (handle, worker) VALUES ('late', 'w1')")
        assert await changes(pool) == []  # not visible yet: left for a later take
        await tx.commit()
        assert await changes(pool) == [("w1", "containers")]
        assert await changes(pool) == []  # taken once
    finally:
        await writer.close()


async def test_the_collectors_own_writes_are_not_fed_back(pool: asyncpg.Pool) -> None:
    acts = ReaperActivities(pool, make_settings(missing_ttl=60, heartbeat_interval=10))
    start = datetime.now(UTC) - timedelta(minutes=10)
    await pool.execute(
        "INSERT INTO reaper.workers (name, state, state_since) VALUES ('w1', 'running', $1)",
        start,
    )
    await insert(pool, "containers", "w1", ["c-1", "c-2"], at=start)
    await pool.execute(
        "INSERT INTO reaper.tasks (id, worker, state) VALUES ('t-1', 'w1', 'pending')"
    )
    await changes(pool)  # the scheduler's inserts

    def report(kind: str, handles: list[str], after_s: float) -> ReconcileInput:
        at = start + timedelta(seconds=after_s)
        return ReconcileInput(
            worker="w1",
            kind=kind,  # type: ignore[arg-type]
            handles=handles,
            taken_at=at,
            missing_ttl=60,
            report=sealed("w1", kind, handles, at),
        )

    marked = await acts.reconcile_report(report("containers", ["c-1"], 1))  # marks c-2
    assert marked.status.missing == 1
    started = await acts.reconcile_report(report("tasks", ["t-1"], 1))  # t-1 -> running
    assert started.started == ["t-1"]
    at = start + timedelta(seconds=62)
    done = await acts.destroy_missing(
        DestroyInput(
            worker="w1",
            kind="containers",
            cutoff=at - timedelta(seconds=60),
            missing_ttl=60,
            report=sealed("w1", "containers", ["c-1"], at),
        )
    )
    assert done.destroyed == ["c-2"]
    assert await changes(pool) == []
