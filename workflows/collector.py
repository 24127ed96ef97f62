"""``HandleCollector``: the handle GC of one worker (``gc-{worker}``), a child of its liveness.

For each complete report the liveness forwards, it reconciles (marks newly missing handles,
clears returned ones), then destroys what has been missing for ``MISSING_TTL`` on the
evidence of that fresh report. Between reports it waits out the TTL with a durable timer;
when one falls due it asks the liveness for the next report, so a destroy always follows a
recheck against a report received after the TTL ran out (CONTRACT.md rule 4). Reports are
processed one at a time, in order, so no destroy races a reconcile.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities import ReaperActivities
    from activities.types import DestroyInput, ReconcileInput
    from reaper.core.policy import collection
    from reaper.core.contract import KINDS
    from reaper.core.models import CollectorInput, GcStatusInput, KindStatus, Report
    from workflows.common import ACTIVITY_TIMEOUT, RETRY, liveness_id, nudge, signal_quietly

HISTORY_CAP = 8_000


@workflow.defn(name="HandleCollector")
class HandleCollector:
    """GC of one worker's containers, volumes and tasks. Signal ``report`` (list of reports)."""

    @workflow.init
    def __init__(self, inp: CollectorInput) -> None:
        self.inp = inp
        self.queue: dict[str, Report] = {}
        self.due: dict[str, datetime] = dict(inp.due)
        self.asked: set[str] = set()
        self.sent: dict[str, GcStatusInput] = {}
        self.busy = False
        self.processed = inp.processed
        self.boots: dict[str, str] = dict(inp.boots)
        self.suspects: dict[str, str] = {}
        self.report(inp.queued)

    @workflow.signal(name="report")
    def report(self, reports: list[Report]) -> None:
        """Queue complete reports; a newer report of a kind supersedes a queued older one."""
        for r in reports:
            queued = self.queue.get(r.kind)
            if queued is not None:
                self.processed += 1  # superseded: counted as handled
                if queued.taken_at > r.taken_at:
                    continue
                if queued.staged is not None or r.staged is not None or queued.restart_all:
                    r.restart_all = True  # handles not at hand: restart every mark
                else:
                    r.also_seen = collection.coalesce(queued.handles, queued.also_seen, r.handles)
            self.queue[r.kind] = r

    @workflow.query(name="backlog")
    def backlog(self) -> int:
        """Reports queued or being processed (0 when the collector is idle)."""
        return len(self.queue) + (1 if self.busy else 0)

    @workflow.query(name="processed")
    def processed_reports(self) -> int:
        """Reports received and handled (reconciled, or superseded by a newer one)."""
        return self.processed

    @workflow.query(name="due")
    def due_times(self) -> dict[str, datetime]:
        """Per kind, when the oldest missing handle falls due (UTC)."""
        return dict(self.due)

    @workflow.run
    async def run(self, inp: CollectorInput) -> None:
        t = inp.timings
        workflow.set_current_details(
            f"Handle GC of worker **{inp.worker}**: a handle absent from every complete report "
            f"for {t.missing_ttl:g}s is destroyed (dry run: {t.dry_run})."
        )
        while True:
            await self._wait()
            for kind in KINDS:
                report = self.queue.pop(kind, None)
                if report is not None:
                    self.busy = True
                    try:
                        await self._collect(report)
                    finally:
                        self.busy = False
                        self.processed += 1
            if self._should_continue_as_new() and not self.queue:
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(
                    CollectorInput(worker=inp.worker, timings=t,
                                   queued=list(self.queue.values()), due=self.due,
                                   processed=self.processed, boots=self.boots)
                )

    def _should_continue_as_new(self) -> bool:
        info = workflow.info()
        return info.is_continue_as_new_suggested() or info.get_current_history_length() >= HISTORY_CAP

    async def _wait(self) -> None:
        waiting = {k: d for k, d in self.due.items() if k not in self.asked}
        if not waiting:
            await workflow.wait_condition(lambda: bool(self.queue) or self._should_continue_as_new())
            return
        first = min(waiting.values())
        timeout = (first - workflow.now()).total_seconds()
        if timeout > 0:
            try:
                await workflow.wait_condition(
                    lambda: bool(self.queue), timeout=timeout,
                    timeout_summary=f"missing TTL: {', '.join(sorted(waiting))} due",
                )
                return
            except asyncio.TimeoutError:
                pass
        now = workflow.now()
        for kind, due in sorted(waiting.items()):
            if due <= now:
                self.asked.add(kind)
                await signal_quietly(liveness_id(self.inp.worker), "want_report", kind)

    async def _collect(self, r: Report) -> None:
        t, worker = self.inp.timings, self.inp.worker
        # A mass drop is believed when a second report confirms it, or when the worker
        # rebooted (a wiped agent legitimately holds nothing of its old boot).
        rebooted = self.boots.get(r.kind) not in (None, r.boot_id)
        confirmed = rebooted or self.suspects.get(r.kind) == r.digest
        res = await workflow.execute_activity_method(
            ReaperActivities.reconcile_report,
            ReconcileInput(worker=worker, kind=r.kind, handles=r.handles, taken_at=r.taken_at,
                           missing_ttl=t.missing_ttl, also_seen=r.also_seen,
                           restart_all=r.restart_all, staged=r.staged,
                           creating_timeout=t.creating_timeout, dry_run=t.dry_run,
                           confirmed=confirmed, max_drop_fraction=t.max_drop_fraction,
                           suspect_min_handles=t.suspect_min_handles),
            start_to_close_timeout=ACTIVITY_TIMEOUT, retry_policy=RETRY,
            summary=(f"reconcile staged {r.kind} report {r.staged}" if r.staged
                     else f"reconcile {len(r.handles)} {r.kind}"),
        )
        if res.skipped is not None:
            workflow.logger.info("report of %s %s skipped: %s", worker, r.kind, res.skipped)
            return
        self.boots[r.kind] = r.boot_id
        if res.suspect is not None:
            workflow.logger.warning("report of %s %s not trusted yet: %s", worker, r.kind,
                                    res.suspect)
            self.suspects[r.kind] = r.digest
            await signal_quietly(liveness_id(worker), "want_report", r.kind)
        else:
            self.suspects.pop(r.kind, None)
        status = res.status
        if status.next_due is not None and r.taken_at >= status.next_due:
            done = await workflow.execute_activity_method(
                ReaperActivities.destroy_missing,
                DestroyInput(worker=worker, kind=r.kind,
                             cutoff=r.taken_at - timedelta(seconds=t.missing_ttl),
                             missing_ttl=t.missing_ttl, dry_run=t.dry_run),
                start_to_close_timeout=ACTIVITY_TIMEOUT, retry_policy=RETRY,
                summary=f"destroy {r.kind} missing for {t.missing_ttl:g}s",
            )
            if done.refused is None:
                status = KindStatus(missing=done.status.missing, next_due=done.status.next_due,
                                    orphans=status.orphans)
                for target in sorted({w for _, w in done.replacements}):
                    await nudge(target)
            else:
                # Stalled, lost or a disrupted fleet: look again after STALL_AFTER, not at
                # every beat.
                workflow.logger.info("destroy on %s refused: %s", worker, done.refused)
                later = workflow.now() + timedelta(seconds=t.stall_after)
                status = KindStatus(missing=status.missing, orphans=status.orphans,
                                    next_due=max(status.next_due, later))
        self._set_due(r.kind, status.next_due)
        await self._report_status(GcStatusInput(kind=r.kind, status=status,
                                                assignments=res.assignments))

    def _set_due(self, kind: str, due: datetime | None) -> None:
        self.asked.discard(kind)
        if due is None:
            self.due.pop(kind, None)
        else:
            self.due[kind] = due

    async def _report_status(self, update: GcStatusInput) -> None:
        if self.sent.get(update.kind) == update:
            return
        self.sent[update.kind] = update
        await signal_quietly(liveness_id(self.inp.worker), "gc_status", update)

