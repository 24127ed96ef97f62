"""Report intake of a liveness: which complete reports reach the collector, and how.

A complete report is queued per kind when it needs reconciling
(``policy.collection.should_forward``); a newer one supersedes a queued older one. Large
reports arrive in chunks that are staged in Postgres, and plain reports too large for
workflow state are staged the same way, so no signal or payload holds a large list. The
liveness loop calls :meth:`ReportIntake.stage_chunks` and :meth:`ReportIntake.forward`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from temporalio import workflow
from temporalio.exceptions import WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from reaper.core.contract import KINDS, Heartbeat
    from reaper.core.liveness_state import LivenessState, QueuedChunk
    from reaper.core.models import CollectorInput, Report, supersede
    from reaper.core.policy import rollout
    from reaper.core.policy.collection import should_forward, superseded_chunks
    from reaper.core.protocol import payload_bytes, report_digest
    from workflows import hooks
    from workflows.collector import HandleCollector
    from workflows.common import collector_id
    from workflows.staging import (
        INLINE_KEEP_BYTES,
        next_batch,
        stage_batch,
        stage_inline,
    )


class ReportIntake:
    """Queues, stages and forwards one worker's complete reports.

    Args:
        live: the liveness's state (shared, mutated here).
        reject: records a rejected input (logged, counted in the ``state`` query).
    """

    def __init__(self, live: LivenessState, reject: Callable[[str], None]) -> None:
        self.live = live
        self.reject = reject
        self.staging_busy = False
        """A batch of chunks is being staged (counted in the backlog the query shows)."""

    def backlog(self) -> int:
        """Reports and chunks received but not yet handed to the collector."""
        live = self.live
        return len(live.unforwarded) + len(live.chunks) + int(self.staging_busy)

    def offer(self, report: Report, force: bool) -> None:
        """Queue a complete report if it needs reconciling; ``force`` after a return. Every
        complete report offered is noted in ``complete_at`` (no command: state only)."""
        live = self.live
        kind = report.kind
        seen = live.complete_at.get(kind)
        if seen is None or seen < report.taken_at:
            live.complete_at[kind] = report.taken_at
        if live.returned_at is not None and report.taken_at < live.returned_at:
            return  # taken before the latest return (a chunked report finished late)
        queued = live.unforwarded.get(kind)
        if queued is not None:
            if queued.digest != report.digest or force:
                live.unforwarded[kind] = supersede(queued, report)
            return
        decision = should_forward(
            report.digest,
            live.forwarded_digest.get(kind),
            report.taken_at,
            live.forwarded_at.get(kind),
            self._resync_after(),
            kind in live.wanted or force,
        )
        if decision.forward:
            live.unforwarded[kind] = report

    def _resync_after(self) -> float:
        """Seconds after which an unchanged report is diffed again although nothing asked.

        Changes to the worker's rows ask for a diff through the change feed (``nudge``), so
        this is only the safety net, ``FULL_RESYNC_INTERVAL`` (``RESYNC_INTERVAL`` in timings
        that carry none). Half a heartbeat early: beats come
        at near-multiples of the interval, so the decision never sits on a boundary that a
        replay could see a few ms apart.
        """
        t = self.live.timings
        if t is None:
            return 0.0
        every = t.resync_interval
        if t.full_resync_interval is not None:
            every = t.full_resync_interval
        return every - t.heartbeat_interval / 2

    def take(self, beat: Heartbeat, now: datetime, returned: bool) -> None:
        """Offer the beat's complete reports (inline, digest-only or chunked) to the intake."""
        for kind in KINDS:
            handles = beat.report(kind)
            if handles is not None:
                self.offer(
                    Report(
                        kind=kind,
                        handles=handles,
                        taken_at=now,
                        boot_id=beat.boot_id,
                        digest=report_digest(handles),
                    ),
                    force=returned,
                )
            elif beat.digests and kind in beat.digests:
                # "Unchanged, and this is its digest": a complete report if the controller
                # holds that very report; otherwise liveness only (the agent resends).
                known = self.known_report(kind, beat.digests[kind])
                if known is not None:
                    self.offer(
                        known.model_copy(
                            update={
                                "taken_at": now,
                                "boot_id": beat.boot_id,
                                "also_seen": [],
                                "restart_all": False,
                            }
                        ),
                        force=returned,
                    )
        if beat.chunk is not None:
            self.live.chunks.append(
                QueuedChunk(chunk=beat.chunk, taken_at=now, boot_id=beat.boot_id, returned=returned)
            )

    def recheck_held(self, kind: str) -> None:
        """Reconcile the last report of ``kind`` forwarded again, now, unless a newer one is
        queued: the agent holds what it held then until its report changes (a changed one
        is forwarded anyway). Rows changed since it was taken are not marked by it (rule
        2); the kind stays wanted, so the next report is reconciled too."""
        held = self.live.last_reports.get(kind)
        if held is not None and kind not in self.live.unforwarded:
            self.live.unforwarded[kind] = held

    def known_report(self, kind: str, digest: str) -> Report | None:
        """The complete report of ``kind`` with ``digest`` that this liveness holds, if any."""
        for report in (self.live.unforwarded.get(kind), self.live.last_reports.get(kind)):
            if report is not None and report.digest == digest:
                return report
        return None

    async def stage_chunks(self) -> None:
        """Stage queued chunks in Postgres; a report whose last chunk is in is offered.

        Consecutive chunks of one report are staged up to ``STAGE_PARALLEL`` at a time (one
        activity each, every payload under 128 KiB): a 100,000-handle report is ~50 chunks,
        and one round trip each in sequence dominated its end-to-end time. Queued chunks of
        a report that a newer one supersedes are dropped unstaged
        (``drop-superseded-chunks``).
        """
        self.staging_busy = True
        try:
            while self.live.chunks:
                self._drop_superseded()
                batch = next_batch(self.live.chunks)
                for report, returned in await stage_batch(self.live, batch, self.reject):
                    # A report that superseded dropped chunks is diffed even if it equals
                    # the last one reconciled: a dropped report may have seen a marked
                    # handle, and its restart must reach the rows.
                    self.offer(report, force=returned or report.restart_all)
        finally:
            self.staging_busy = False

    def _drop_superseded(self) -> None:
        """Drop queued chunks of reports that a newer queued report of their kind supersedes
        (``policy.collection.superseded_chunks``); the newest report restarts every mark of
        its kind."""
        live = self.live
        drop = superseded_chunks([(q.chunk.kind, q.chunk.report_id) for q in live.chunks])
        if not any(drop):
            return
        dropped = {q.chunk.kind for q, gone in zip(live.chunks, drop, strict=True) if gone}
        live.chunks = [q for q, gone in zip(live.chunks, drop, strict=True) if not gone]
        for q in live.chunks:
            if q.chunk.kind in dropped:
                q.restart_all = True
        workflow.logger.info(
            "%s: dropped %d queued chunks of superseded %s reports",
            live.worker,
            sum(drop),
            ", ".join(sorted(dropped)),
            extra={"worker": live.worker, "action": "dropped", "reason": "superseded"},
        )

    async def forward(self) -> None:
        """Hand every queued report to the collector (started on first use)."""
        live = self.live
        reports = []
        for kind in KINDS:
            report = live.unforwarded.get(kind)
            if report is None:
                continue
            if report.staged_id is None and payload_bytes(report.handles) > INLINE_KEEP_BYTES:
                report = await stage_inline(live, report)
            newer = live.unforwarded.get(kind)
            if newer is not None and newer.taken_at > report.taken_at:
                continue  # superseded while staging: forward the newer one next round
            live.unforwarded.pop(kind, None)
            reports.append(report)
            live.last_reports[kind] = report.model_copy(
                update={"also_seen": [], "restart_all": False}
            )
        if not reports:
            return
        reports = [self._sealed(r) for r in reports]
        live.forwarded += len(reports)
        for report in reports:
            before = live.forwarded_at.get(report.kind)
            if (
                live.features.uses(rollout.ROTATING_HOSTS)
                and before is not None
                and report.taken_at <= before
            ):
                continue  # a held report again (recheck_held): the next one is still wanted
            live.forwarded_digest[report.kind] = report.digest
            live.forwarded_at[report.kind] = report.taken_at
            if report.kind in live.wanted:
                live.wanted.remove(report.kind)
        if not live.collector_started:
            await self._start_collector(reports)
            return
        try:
            await workflow.get_external_workflow_handle(collector_id(live.worker)).signal(
                "report", reports
            )
        except Exception as exc:  # collector gone (terminated by hand): start a new one
            workflow.logger.warning(
                "collector of %s unreachable (%s); restarting it", live.worker, exc
            )
            await self._start_collector(reports)

    def _sealed(self, r: Report) -> Report:
        """``r`` with the seal its collector checks before acting on it (§5.2)."""
        mark = hooks.seal(self.live.worker, r.kind, r)
        return r.model_copy(update={"seal": mark})

    async def _start_collector(self, reports: list[Report]) -> None:
        live = self.live
        assert live.timings is not None
        try:
            await workflow.start_child_workflow(
                HandleCollector.run,
                CollectorInput(worker=live.worker, timings=live.timings, queued=reports),
                id=collector_id(live.worker),
                static_summary=f"handle GC of {live.worker}",
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            )
        except WorkflowAlreadyStartedError:
            await workflow.get_external_workflow_handle(collector_id(live.worker)).signal(
                "report", reports
            )
        live.collector_started = True
