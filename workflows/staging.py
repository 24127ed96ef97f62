"""Staging of large reports in Postgres for a liveness's intake (``workflows.intake``).

A report too large for one signal arrives in chunks (CONTRACT.md §2 is silent on size; the
agent protocol guide describes chunks); a plain report too large for workflow state is cut
into chunks here. Each chunk is one ``stage_chunk`` activity, so no signal, payload or
workflow state holds a large list; a report whose last chunk is in becomes a staged report
(``Report.staged_id``) that the collector reconciles from Postgres.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities import ReaperActivities
    from activities.types import StageChunk
    from reaper.core.liveness_state import LivenessState, QueuedChunk, Staging
    from reaper.core.models import Report
    from reaper.core.protocol import chunk_handles
    from workflows.common import run_activity, start_activity

STAGE_PARALLEL = 16
"""Chunks of one report staged at once (``wide-staging``, issue 20): each activity holds a
connection for its insert only (a few milliseconds; the per-report lock is taken after it),
so a 52-chunk report takes 4 rounds of activities (13 at 1.0's four)."""
INLINE_KEEP_BYTES = 64 * 1024
"""A report larger than this (JSON bytes of its handles) is staged in Postgres, not kept in
workflow state or sent to the collector in a signal (no payload near Temporal's 256 KiB)."""


def next_batch(chunks: list[QueuedChunk], width: int = STAGE_PARALLEL) -> list[QueuedChunk]:
    """Take the next chunks to stage at once from ``chunks``: consecutive chunks of one
    report, at most ``width``."""
    batch = [chunks.pop(0)]
    first = batch[0].chunk
    while (
        len(batch) < width
        and chunks
        and (chunks[0].chunk.kind, chunks[0].chunk.report_id) == (first.kind, first.report_id)
    ):
        batch.append(chunks.pop(0))
    return batch


async def stage_batch(
    live: LivenessState, batch: list[QueuedChunk], reject: Callable[[str], None]
) -> list[tuple[Report, bool]]:
    """Stage ``batch`` concurrently (one activity per chunk).

    Args:
        live: the liveness's state; its ``staging`` per kind is updated.
        batch: chunks of one report, from :func:`next_batch`.
        reject: records a rejected input (a chunk that disagrees with its first chunk, a
            report whose handles do not match its digest).

    Returns:
        The reports completed by this batch, each with whether its beat was a return, in
        order, for the intake to offer.
    """
    jobs = []
    for queued in batch:
        chunk, at, boot_id = queued.chunk, queued.taken_at, queued.boot_id
        staging = live.staging.get(chunk.kind)
        if staging is None or staging.report_id != chunk.report_id:
            staging = Staging(
                report_id=chunk.report_id,
                count=chunk.count,
                digest=chunk.digest,
                taken_at=at,
                boot_id=boot_id,
            )
            live.staging[chunk.kind] = staging
        staging.restart_all = staging.restart_all or queued.restart_all
        if (chunk.count, chunk.digest) != (staging.count, staging.digest):
            reject(
                f"chunk {chunk.index} of report {chunk.report_id} disagrees "
                "with its first chunk on count or digest"
            )
            continue
        handle = start_activity(
            ReaperActivities.stage_chunk,
            StageChunk(
                worker=live.worker,
                kind=chunk.kind,
                report_id=chunk.report_id,
                index=chunk.index,
                count=chunk.count,
                digest=chunk.digest,
                handles=chunk.handles,
                keep=kept_staged_id(live, chunk.kind),
            ),
            summary=f"stage {chunk.kind} chunk {chunk.index + 1}/{chunk.count}",
        )
        jobs.append((chunk, staging, queued.returned, handle))
    results = await asyncio.gather(*(job[3] for job in jobs))
    complete = []
    for (chunk, staging, returned, _), res in zip(jobs, results, strict=True):
        staging.chunks_staged = max(staging.chunks_staged, res.chunks_staged)
        if not res.complete:
            continue
        if live.staging.get(chunk.kind) is staging:
            del live.staging[chunk.kind]
        if not res.digest_ok:
            reject(f"chunked report {chunk.report_id}: handles do not match digest")
            continue
        report = Report(
            kind=chunk.kind,
            handles=[],
            staged_id=chunk.report_id,
            taken_at=staging.taken_at,
            boot_id=staging.boot_id,
            digest=staging.digest,
            restart_all=staging.restart_all,
        )
        complete.append((report, returned))
    return complete


def kept_staged_id(live: LivenessState, kind: str) -> str | None:
    """The staged report of ``kind`` that the collector may still read (not to be dropped)."""
    last = live.last_reports.get(kind)
    return last.staged_id if last else None


async def stage_inline(live: LivenessState, report: Report) -> Report:
    """A plain report too large to keep in workflow state, staged like a chunked one;
    returns it as a staged report."""
    report_id = f"inline-{live.forwarded}-{report.digest[:12]}"
    parts = chunk_handles(report.handles, INLINE_KEEP_BYTES)
    for i, part in enumerate(parts):
        await run_activity(
            ReaperActivities.stage_chunk,
            StageChunk(
                worker=live.worker,
                kind=report.kind,
                report_id=report_id,
                index=i,
                count=len(parts),
                digest=report.digest,
                handles=part,
                keep=kept_staged_id(live, report.kind),
            ),
            summary=f"stage large {report.kind} report {i + 1}/{len(parts)}",
        )
    return report.model_copy(update={"handles": [], "staged_id": report_id})
