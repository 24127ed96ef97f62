"""Orphans are visible: one ``orphan`` events row per handle that becomes an orphan, written
by ``reconcile_report`` against real Postgres, and never a second one for the same orphan
(a retry, a rerun, every later report that still lists it)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from activities import ReaperActivities
from activities.types import ReconcileInput
from tests.support.controller import make_settings
from tests.support.sealed import sealed

TTL = 5.0


async def _orphan_rows(pool: asyncpg.Pool, worker: str) -> list[tuple[str, str, str]]:
    rows = await pool.fetch(
        "SELECT kind, handle, reason FROM reaper.events WHERE worker = $1 AND action = 'orphan'"
        " ORDER BY kind, handle",
        worker,
    )
    return [(r["kind"], r["handle"], r["reason"]) for r in rows]


async def test_an_orphan_is_recorded_once_across_reruns(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reaper.events")
    acts = ReaperActivities(pool, make_settings())
    start = datetime.now(UTC) - timedelta(minutes=10)
    await pool.execute(
        "INSERT INTO reaper.workers (name, state, state_since) VALUES ('w1', 'running', $1)",
        start,
    )
    await pool.execute(
        "INSERT INTO reaper.tasks (id, worker, state, stop_reason) VALUES"
        " ('t-reaped', 'w1', 'lost', 'worker-lost')"
    )

    def report(kind: str, handles: list[str], after_s: float) -> ReconcileInput:
        return ReconcileInput(
            worker="w1",
            kind=kind,  # type: ignore[arg-type]
            handles=handles,
            taken_at=start + timedelta(seconds=after_s),
            missing_ttl=TTL,
            report=sealed("w1", kind, handles, start + timedelta(seconds=after_s)),
        )

    # First seen: unknown, not an orphan yet (MISSING_TTL has not passed), no row.
    first = await acts.reconcile_report(report("containers", ["stray"], 1))
    assert first.status.orphans == []
    assert await _orphan_rows(pool, "w1") == []

    # Past MISSING_TTL: an orphan, one row; the same report again, and later ones, add none.
    for after in (1 + TTL, 1 + TTL, 2 + TTL, 30):
        res = await acts.reconcile_report(report("containers", ["stray"], after))
        assert res.status.orphans == ["stray"]
    # A reaped task the worker still reports is an orphan at once (rule 7), once.
    for after in (2, 3):
        res = await acts.reconcile_report(report("tasks", ["t-reaped"], after))
        assert res.status.orphans == ["t-reaped"]

    rows = await _orphan_rows(pool, "w1")
    assert [(k, h) for k, h, _ in rows] == [("container", "stray"), ("task", "t-reaped")]
    assert "unknown" in rows[0][2] and "reaped" in rows[1][2]
    # One log line per row written, with the row's fields.
    logged = [r for r in caplog.records if getattr(r, "action", None) == "orphan"]
    assert [(r.worker, r.kind, r.handle) for r in logged] == [  # type: ignore[attr-defined]
        ("w1", "container", "stray"),
        ("w1", "task", "t-reaped"),
    ]
    assert logged[0].getMessage().startswith("w1: orphan container stray (reported but unknown")

    # The agent destroyed it; when the same name is reported again later it is a new
    # orphan (a new first report), so it gets a row of its own after MISSING_TTL.
    await acts.reconcile_report(report("containers", [], 40))
    await acts.reconcile_report(report("containers", ["stray"], 50))
    await acts.reconcile_report(report("containers", ["stray"], 50 + TTL))
    rows = await _orphan_rows(pool, "w1")
    assert [(k, h) for k, h, _ in rows] == [
        ("container", "stray"),
        ("container", "stray"),
        ("task", "t-reaped"),
    ]
