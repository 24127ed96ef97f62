"""Staging large reports: chunks land in ``reaper.report_chunks`` until the collector diffs
them, so no Temporal payload holds a whole 100,000-handle report."""

from __future__ import annotations

import asyncpg
from temporalio import activity

from activities.base import ActivityBase
from activities.types import StageChunk, StageResult
from reaper.core.protocol import report_digest


async def staged_handles(
    conn: asyncpg.Connection, worker: str, kind: str, report_id: str
) -> list[str] | None:
    """The handles of a staged report in chunk order, or ``None`` if none are staged."""
    rows = await conn.fetch(
        "SELECT handles FROM reaper.report_chunks WHERE worker = $1 AND kind = $2"
        " AND report_id = $3 ORDER BY idx",
        worker,
        kind,
        report_id,
    )
    if not rows:
        return None
    return [h for r in rows for h in r["handles"]]


class StagingActivities(ActivityBase):
    """Activities called by ``WorkerLiveness`` while a chunked report arrives."""

    @activity.defn(name="stage_chunk")
    async def stage_chunk(self, inp: StageChunk) -> StageResult:
        """Store one chunk (idempotent: a duplicate chunk changes nothing) and drop chunks of
        abandoned reports. When the last chunk is in, check the digest of the whole report;
        a report whose handles do not hash to its digest is dropped and marks nothing.
        Safe to run for several chunks of a report at once (a transaction lock per worker
        and kind orders them).
        """
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO reaper.report_chunks"
                " (worker, kind, report_id, idx, count, digest, handles)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
                inp.worker,
                inp.kind,
                inp.report_id,
                inp.index,
                inp.count,
                inp.digest,
                inp.handles,
            )
            # Chunks of one report may be staged concurrently: each takes this lock after its
            # insert and holds it until it commits, so the last one to take it sees every
            # chunk committed and completes the report. (The insert, the costly statement,
            # stays outside the lock; the count is taken in a statement after it.)
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))", inp.worker, inp.kind
            )
            staged = await conn.fetchval(
                "WITH dropped AS (DELETE FROM reaper.report_chunks WHERE worker = $1"
                " AND kind = $2 AND report_id <> $3 AND report_id IS DISTINCT FROM $4)"
                " SELECT count(*) FROM reaper.report_chunks WHERE worker = $1 AND kind = $2"
                " AND report_id = $3",
                inp.worker,
                inp.kind,
                inp.report_id,
                inp.keep,
            )
            if staged < inp.count:
                return StageResult(chunks_staged=staged)
            handles = await staged_handles(conn, inp.worker, inp.kind, inp.report_id) or []
            if report_digest(handles) != inp.digest:
                await conn.execute(
                    "DELETE FROM reaper.report_chunks WHERE worker = $1 AND kind = $2"
                    " AND report_id = $3",
                    inp.worker,
                    inp.kind,
                    inp.report_id,
                )
                return StageResult(chunks_staged=0, complete=True, digest_ok=False)
            return StageResult(chunks_staged=staged, complete=True)
