"""Orphans are visible: one ``orphan`` events row per handle that becomes an orphan, written
by ``reconcile_report`` against real Postgres, and never a second one for the same orphan
(a retry, a rerun, every later report that still lists it)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from activities import ReaperActivities
from activities.types import ReconcileInput, ReconcileResult, StageChunk
from reaper.core.protocol import report_digest
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


async def test_a_reported_row_collected_as_stuck_creating_is_unknown_at_once(
    pool: asyncpg.Pool,
) -> None:
    """A row failed by CREATING_TIMEOUT in the same reconcile is gone: the worker still
    reports its handle, which is tracked as unknown from that report (and becomes an orphan
    MISSING_TTL later), not only from the next report diffed."""
    acts = ReaperActivities(pool, make_settings())
    start = datetime.now(UTC) - timedelta(hours=3)
    await pool.execute(
        "INSERT INTO reaper.workers (name, state, state_since) VALUES ('w2', 'running', $1)",
        start,
    )
    await pool.execute(
        "INSERT INTO reaper.containers (handle, worker, state, state_changed_at) VALUES"
        " ('c-stuck', 'w2', 'creating', $1), ('c-kept', 'w2', 'created', $1)",
        start,
    )
    handles = ["c-stuck", "c-kept"]

    def report(after_s: float) -> ReconcileInput:
        at = start + timedelta(hours=2, seconds=after_s)
        return ReconcileInput(
            worker="w2",
            kind="containers",
            handles=handles,
            taken_at=at,
            missing_ttl=TTL,
            creating_timeout=3600,
            report=sealed("w2", "containers", handles, at),
        )

    res = await acts.reconcile_report(report(0))
    assert res.marked == 0 and res.status.orphans == []
    assert [r["handle"] for r in await pool.fetch("SELECT handle FROM reaper.containers")] == [
        "c-kept"
    ]
    unknown = await pool.fetch("SELECT handle, first_seen FROM reaper.unknown_handles")
    assert [(r["handle"], r["first_seen"]) for r in unknown] == [("c-stuck", report(0).taken_at)]
    res = await acts.reconcile_report(report(TTL))
    assert res.status.orphans == ["c-stuck"]


async def test_a_staged_report_repeating_a_handle_lists_its_orphan_once(
    pool: asyncpg.Pool,
) -> None:
    """A staged report is diffed with its repeats (chunks are not deduplicated): an unknown
    handle listed in two chunks is one unknown handle, one orphan, one events row."""
    acts = ReaperActivities(pool, make_settings())
    start = datetime.now(UTC) - timedelta(minutes=10)
    await pool.execute(
        "INSERT INTO reaper.workers (name, state, state_since) VALUES ('w3', 'running', $1)",
        start,
    )
    await pool.execute(
        "INSERT INTO reaper.containers (handle, worker, state, state_changed_at) VALUES"
        " ('c-1', 'w3', 'created', $1), ('c-gone', 'w3', 'created', $1)",
        start,
    )
    chunks = [["c-1", "stray"], ["stray", "c-1"]]
    digest = report_digest([h for c in chunks for h in c])

    async def staged_report(report_id: str, after_s: float) -> ReconcileResult:
        for i, part in enumerate(chunks):
            await acts.stage_chunk(
                StageChunk(
                    worker="w3",
                    kind="containers",
                    report_id=report_id,
                    index=i,
                    count=len(chunks),
                    digest=digest,
                    handles=part,
                )
            )
        at = start + timedelta(seconds=after_s)
        return await acts.reconcile_report(
            ReconcileInput(
                worker="w3",
                kind="containers",
                handles=[],
                staged_id=report_id,
                taken_at=at,
                missing_ttl=TTL,
                confirmed=True,
                report=sealed("w3", "containers", [], at, staged_id=report_id, digest=digest),
            )
        )

    first = await staged_report("r1", 1)
    assert first.marked == 1 and first.status.orphans == []
    assert await pool.fetchval("SELECT count(*) FROM reaper.unknown_handles") == 1
    later = await staged_report("r2", 1 + TTL)
    assert later.status.orphans == ["stray"]
    assert [(k, h) for k, h, _ in await _orphan_rows(pool, "w3")] == [("container", "stray")]


async def test_an_inline_report_repeating_a_handle_lists_its_orphan_once(
    pool: asyncpg.Pool,
) -> None:
    """An inline report is copied with its repeats too: one unknown handle, one orphan."""
    acts = ReaperActivities(pool, make_settings())
    start = datetime.now(UTC) - timedelta(minutes=10)
    await pool.execute(
        "INSERT INTO reaper.workers (name, state, state_since) VALUES ('w4', 'running', $1)",
        start,
    )
    await pool.execute(
        "INSERT INTO reaper.containers (handle, worker, state, state_changed_at) VALUES"
        " ('c-1', 'w4', 'created', $1), ('c-gone', 'w4', 'created', $1)",
        start,
    )
    handles = ["c-1", "stray", "stray", "c-1"]
    results = []
    for after in (1, 1 + TTL):
        at = start + timedelta(seconds=after)
        results.append(
            await acts.reconcile_report(
                ReconcileInput(
                    worker="w4",
                    kind="containers",
                    handles=handles,
                    taken_at=at,
                    missing_ttl=TTL,
                    confirmed=True,
                    report=sealed("w4", "containers", handles, at),
                )
            )
        )
    assert results[0].marked == 1 and results[0].cleared == 0
    assert results[1].status.orphans == ["stray"]
    assert await pool.fetchval("SELECT count(*) FROM reaper.unknown_handles") == 1
    assert [(k, h) for k, h, _ in await _orphan_rows(pool, "w4")] == [("container", "stray")]
