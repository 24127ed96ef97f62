"""``set_draining`` against real Postgres: requests applied in order, an ``events`` row for
each that changes ``workers.draining``, and nothing more on a retry or a rerun."""

from __future__ import annotations

import asyncpg

from activities import ReaperActivities
from activities.types import DrainChange
from reaper.core.liveness_state import DrainRequest
from tests.support.controller import make_settings


async def _reason(pool: asyncpg.Pool, worker: str) -> str | None:
    return await pool.fetchval("SELECT drain_reason FROM reaper.workers WHERE name = $1", worker)


async def _state(pool: asyncpg.Pool, worker: str) -> tuple[bool, list[tuple[str, str, str]]]:
    draining = await pool.fetchval("SELECT draining FROM reaper.workers WHERE name = $1", worker)
    rows = await pool.fetch(
        "SELECT action, reason, actor FROM reaper.events WHERE worker = $1 ORDER BY id", worker
    )
    return draining, [(r["action"], r["reason"], r["actor"]) for r in rows]


def change(worker: str, *requests: tuple[bool, str], batch: str = "1") -> DrainChange:
    reqs = [
        DrainRequest(draining=d, reason=r, actor="ops", key=f"{worker}:{batch}:{i}")
        for i, (d, r) in enumerate(requests)
    ]
    *earlier, newest = reqs
    return DrainChange(
        worker=worker,
        draining=newest.draining,
        reason=newest.reason,
        actor=newest.actor,
        key=newest.key,
        earlier=earlier,
    )


async def test_a_drain_and_an_undrain_together_write_both_rows_once(pool):
    acts = ReaperActivities(pool, make_settings())
    await pool.execute("INSERT INTO reaper.workers (name, state_since) VALUES ('w', now())")
    batch = change("w", (True, "kernel upgrade"), (False, "upgrade done"))
    assert await acts.set_draining(batch) is True
    expected = (
        False,
        [("drain", "kernel upgrade", "ops"), ("undrain", "upgrade done", "ops")],
    )
    assert await _state(pool, "w") == expected
    assert await acts.set_draining(batch) is False  # a retry after the commit
    assert await _state(pool, "w") == expected


async def test_a_retry_writes_no_row_that_the_first_attempt_did_not(pool):
    """From undrained, ``undrain, drain`` writes only the drain; on a retry the row is
    draining, where the undrain would change it: its key-less replay would write it."""
    acts = ReaperActivities(pool, make_settings())
    await pool.execute("INSERT INTO reaper.workers (name, state_since) VALUES ('w', now())")
    batch = change("w", (False, "noise"), (True, "disk failing"))
    assert await acts.set_draining(batch) is True
    expected = (True, [("drain", "disk failing", "ops")])
    assert await _state(pool, "w") == expected
    assert await acts.set_draining(batch) is False
    assert await _state(pool, "w") == expected


async def test_a_request_of_an_older_run_without_a_key_is_applied_once(pool):
    acts = ReaperActivities(pool, make_settings())
    old = DrainChange(worker="new", draining=True, reason="rack move", actor="ops")
    assert await acts.set_draining(old) is True  # no row yet: one is made
    assert await acts.set_draining(old) is False
    assert await _state(pool, "new") == (True, [("drain", "rack move", "ops")])


async def test_the_row_keeps_the_reason_of_the_last_change(pool):
    acts = ReaperActivities(pool, make_settings())
    await acts.set_draining(change("w", (True, "A")))
    # Undrained and drained again in one batch: draining as before, with the newer reason.
    assert await acts.set_draining(change("w", (False, "u"), (True, "B"), batch="2")) is True
    assert await _state(pool, "w") == (
        True,
        [("drain", "A", "ops"), ("undrain", "u", "ops"), ("drain", "B", "ops")],
    )
    assert await _reason(pool, "w") == "B"
