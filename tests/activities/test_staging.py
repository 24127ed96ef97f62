"""``stage_chunk`` against real Postgres: the chunks of one report staged at once, as
``WorkerLiveness`` stages them (several activities in flight), complete the report exactly
once; a report whose handles do not hash to its digest is dropped."""

from __future__ import annotations

import asyncio

import asyncpg

from activities import ReaperActivities
from activities.types import StageChunk, StageResult
from reaper.core.protocol import report_digest
from tests.support.controller import make_settings

CHUNKS = 6


def _chunks(report_id: str, digest: str | None = None) -> list[StageChunk]:
    parts = [[f"c-{report_id}-{i}-{j}" for j in range(50)] for i in range(CHUNKS)]
    d = digest or report_digest([h for p in parts for h in p])
    return [
        StageChunk(
            worker="w1",
            kind="containers",
            report_id=report_id,
            index=i,
            count=CHUNKS,
            digest=d,
            handles=p,
        )
        for i, p in enumerate(parts)
    ]


async def test_chunks_staged_at_once_complete_their_report_exactly_once(
    pool: asyncpg.Pool,
) -> None:
    acts = ReaperActivities(pool, make_settings())
    for n in range(10):
        chunks = _chunks(f"r{n}")
        results: list[StageResult] = await asyncio.gather(*map(acts.stage_chunk, chunks))
        done = [r for r in results if r.complete]
        assert len(done) == 1 and done[0].digest_ok and done[0].chunks_staged == CHUNKS, results
        # Staged again (an activity retried): nothing changes, the report is still complete.
        again = await acts.stage_chunk(chunks[0])
        assert again.complete and again.digest_ok
    # Each new report dropped the one before (no ``keep``): only the last is staged.
    rows = await pool.fetch("SELECT report_id, count(*) AS n FROM reaper.report_chunks GROUP BY 1")
    assert [(r["report_id"], r["n"]) for r in rows] == [("r9", CHUNKS)]


async def test_a_report_not_matching_its_digest_is_dropped(pool: asyncpg.Pool) -> None:
    acts = ReaperActivities(pool, make_settings())
    results = await asyncio.gather(*map(acts.stage_chunk, _chunks("bad", digest="0" * 64)))
    done = [r for r in results if r.complete]
    assert len(done) == 1 and not done[0].digest_ok
    assert await pool.fetchval("SELECT count(*) FROM reaper.report_chunks") == 0
