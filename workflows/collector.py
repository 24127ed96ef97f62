"""``HandleCollector``: the handle GC of one worker (``gc-{worker}``), a child of its liveness.

For each complete report the liveness forwards, it reconciles (marks newly missing handles,
clears returned ones), then destroys what has been missing for ``MISSING_TTL`` on the
evidence of that fresh report. Between reports it waits out the TTL with a durable timer;
when one falls due it asks the liveness for the next report, so a destroy always follows a
recheck against a report received after the TTL ran out (CONTRACT.md rule 4). Reports of a
kind are processed one at a time, in order, so no destroy races a reconcile of its kind; the
kinds are collected apart, concurrently, so one slow table (a lock held on ``volumes``) never
stalls the containers' collection (issue 11, Concourse #4152). The rules themselves are
``reaper.core.policy.collection``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from pydantic import TypeAdapter

    from activities import ReaperActivities
    from activities.types import DestroyInput, ReconcileInput, SealedReport
    from reaper.core.contract import KINDS, liveness_id
    from reaper.core.models import (
        CollectorInput,
        CollectorState,
        GcStatusInput,
        KindStatus,
        Report,
        supersede_queued,
    )
    from reaper.core.policy import collection as policy
    from reaper.core.policy import rollout
    from workflows import front_door
    from workflows.common import (
        run_activity,
        should_continue_as_new,
        signal_quietly,
        tell_placed,
    )
    from workflows.view import collector_details

REPORTS = TypeAdapter(list[Report])
"""Validates the argument of signal ``report``."""

KINDS_APART = "kinds-apart"
"""Patch (deprecated since 1.2: always taken): each kind is collected on its own, so one
blocked kind never stalls the others."""


@workflow.defn(name="HandleCollector")
class HandleCollector:
    """GC of one worker's containers, volumes and tasks. Signal ``report`` (list of reports)."""

    @workflow.init
    def __init__(self, *args: Any) -> None:
        self.start = front_door.start_input(CollectorInput.model_validate, args)
        """``None`` when the start input did not parse: ``run`` then ends at once (its
        liveness starts a new collector when its next report finds this one gone)."""
        self.gc = (self.start.carried if self.start else None) or CollectorState()
        self.collecting: dict[str, asyncio.Task[None]] = {}  # kind -> its collection in flight
        self.stopping = False
        self._queue(self.start.queued if self.start else [])

    @property
    def inp(self) -> CollectorInput:
        """The start input (``run`` ends at once when there is none)."""
        assert self.start is not None
        return self.start

    @workflow.signal(name="report")
    def report(self, *args: Any) -> None:
        """Queue complete reports (a list of ``Report``); a newer report of a kind supersedes
        a queued older one."""
        reports = front_door.parse(
            REPORTS.validate_python, front_door.first(args, "report"), "report"
        )
        if reports is not None:
            self._queue(reports)

    def _queue(self, reports: list[Report]) -> None:
        for r in reports:
            queued = self.gc.queue.get(r.kind)
            if queued is not None:
                self.gc.processed += 1  # superseded: counted as handled
                if queued.taken_at > r.taken_at:
                    continue
            self.gc.queue[r.kind] = supersede_queued(queued, r)

    @workflow.signal(name="stop")
    def stop(self, *args: Any) -> None:
        """From the liveness: the worker is retired; end after the report in hand (§5.1)."""
        front_door.first(args, "stop")
        self.stopping = True

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """A signal of a name the collector does not know: ignored, logged, counted."""
        front_door.unknown_signal(name, len(args))

    @workflow.query(name="backlog")
    def backlog(self, *args: Any) -> int:
        """Reports queued or being processed (0 when the collector is idle)."""
        return len(self.gc.queue) + len(self.collecting)

    @workflow.query(name="processed")
    def processed_reports(self, *args: Any) -> int:
        """Reports received and handled (reconciled, or superseded by a newer one)."""
        return self.gc.processed

    @workflow.query(name="due")
    def due_times(self, *args: Any) -> dict[str, datetime]:
        """Per kind, when it next needs a fresh report (UTC): its oldest missing handle falls
        due, or an unknown handle becomes an orphan (``KindStatus.recheck_at``)."""
        return dict(self.gc.due)

    @workflow.run
    async def run(self, *args: Any) -> None:
        """The loop; ``args`` are the start input, parsed once in ``__init__``."""
        if self.start is None:
            workflow.logger.warning("%s: start input unusable; ending", workflow.info().workflow_id)
            return
        inp = self.inp
        t = inp.timings
        workflow.set_current_details(collector_details(inp.worker, t, self.gc))
        while True:
            await self._wait_for_report_or_due()
            self._reap_finished()
            if self.stopping and not self.collecting:  # nothing is left in flight
                await signal_quietly(liveness_id(inp.worker), "gc_stopped", None)
                return
            if self.stopping:
                await workflow.wait_condition(self._any_finished)
                continue
            workflow.deprecate_patch(KINDS_APART)
            for kind in KINDS:
                if kind in self.gc.queue and kind not in self.collecting:
                    report = self.gc.queue.pop(kind)
                    self.collecting[kind] = asyncio.create_task(self._collect(report))
            if should_continue_as_new() and not self.gc.queue and not self.collecting:
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(
                    CollectorInput(worker=inp.worker, timings=t, carried=self.gc)
                )

    async def _wait_for_report_or_due(self) -> None:
        """Wait for a report, or until a kind falls due; then ask the liveness for a fresh one."""
        waiting = {k: d for k, d in self.gc.due.items() if k not in self.gc.asked}
        if not waiting:
            await workflow.wait_condition(
                lambda: self._woken() or (should_continue_as_new() and not self.collecting)
            )
            return
        timeout = (min(waiting.values()) - workflow.now()).total_seconds()
        if timeout > 0:
            try:
                await workflow.wait_condition(
                    self._woken,
                    timeout=timeout,
                    timeout_summary=f"missing TTL: {', '.join(sorted(waiting))} due",
                )
                return
            except TimeoutError:
                pass
        now = workflow.now()
        for kind, due in sorted(waiting.items()):
            if due <= now:
                self.gc.asked.append(kind)
                await signal_quietly(liveness_id(self.inp.worker), "want_report", kind)

    def _woken(self) -> bool:
        """A queued report whose kind is not being collected, a finished collection, or a stop."""
        ready = any(kind not in self.collecting for kind in self.gc.queue)
        return ready or self._any_finished() or self.stopping

    def _any_finished(self) -> bool:
        return any(task.done() for task in self.collecting.values())

    def _reap_finished(self) -> None:
        """Forget finished collections; a collection that raised fails this workflow task
        (retried by Temporal, as an exception in the loop itself would be)."""
        for kind, task in list(self.collecting.items()):
            if task.done():
                del self.collecting[kind]
                self.gc.processed += 1
                task.result()

    async def _collect(self, r: Report) -> None:
        """Reconcile one report; destroy what is due on its evidence; tell the liveness."""
        t, worker = self.inp.timings, self.inp.worker
        # A mass drop is believed when a second report confirms it, or when the worker
        # rebooted (a wiped agent legitimately holds nothing of its old boot).
        rebooted = self.gc.boots.get(r.kind) not in (None, r.boot_id)
        confirmed = rebooted or self.gc.suspects.get(r.kind) == r.digest
        res = await run_activity(
            ReaperActivities.reconcile_report,
            ReconcileInput(
                worker=worker,
                kind=r.kind,
                handles=r.handles,
                taken_at=r.taken_at,
                missing_ttl=t.missing_ttl,
                also_seen=sorted({*r.also_seen, *r.queued_also_seen}),
                restart_all=r.restart_all or r.queued_restart_all,
                staged_id=r.staged_id,
                creating_timeout=t.creating_timeout,
                dry_run=t.dry_run,
                confirmed=confirmed,
                max_drop_fraction=t.max_drop_fraction,
                suspect_min_handles=t.suspect_min_handles,
                report=SealedReport.of(r),
            ),
            summary=(
                f"reconcile staged {r.kind} report {r.staged_id}"
                if r.staged_id
                else f"reconcile {len(r.handles)} {r.kind}"
            ),
        )
        if res.skipped is not None:
            workflow.logger.info("report of %s %s skipped: %s", worker, r.kind, res.skipped)
            return
        self.gc.boots[r.kind] = r.boot_id
        if res.suspect is not None:
            workflow.logger.warning(
                "report of %s %s not trusted yet: %s", worker, r.kind, res.suspect
            )
            self.gc.suspects[r.kind] = r.digest
            await signal_quietly(liveness_id(worker), "want_report", r.kind)
        else:
            self.gc.suspects.pop(r.kind, None)
        status = res.status
        if policy.is_due(status.next_due, r.taken_at):
            status = await self._destroy_due(r, status)
        self._set_due(r.kind, status.recheck_at())
        # Said only where every peer knows it (a 1.1 liveness shows no `drained`, and a
        # status that differs in it alone would send a signal 1.1's collector does not).
        drained = res.drained if rollout.uses(rollout.ROTATING_HOSTS, t.peer_version) else None
        await self._report_status(
            GcStatusInput(kind=r.kind, status=status, assignments=res.assignments, drained=drained)
        )

    async def _destroy_due(self, r: Report, status: KindStatus) -> KindStatus:
        """Destroy the rows of ``r.kind`` due on the evidence of report ``r`` (rule 4)."""
        t, worker = self.inp.timings, self.inp.worker
        done = await run_activity(
            ReaperActivities.destroy_missing,
            DestroyInput(
                worker=worker,
                kind=r.kind,
                cutoff=policy.destroy_cutoff(r.kind, r.taken_at, t.missing_ttl),
                missing_ttl=t.missing_ttl,
                dry_run=t.dry_run,
                report=SealedReport.of(r),
            ),
            summary=f"destroy {r.kind} missing for"
            f" {policy.destroy_after(r.kind, t.missing_ttl):g}s",
        )
        if done.refused is not None:
            workflow.logger.info("destroy on %s refused: %s", worker, done.refused)
            assert status.next_due is not None
            again = policy.destroy_retry_due(status.next_due, workflow.now(), t.stall_after)
            return status.model_copy(update={"next_due": again})
        await tell_placed(done.replacements)
        return status.model_copy(
            update={"missing": done.status.missing, "next_due": done.status.next_due}
        )

    def _set_due(self, kind: str, due: datetime | None) -> None:
        if kind in self.gc.asked:
            self.gc.asked.remove(kind)
        if due is None:
            self.gc.due.pop(kind, None)
        else:
            self.gc.due[kind] = due

    async def _report_status(self, update: GcStatusInput) -> None:
        changed = self.gc.sent.get(update.kind) != update
        self.gc.sent[update.kind] = update
        # Shown after every report (a mass drop held back changes no status); no history event.
        workflow.set_current_details(collector_details(self.inp.worker, self.inp.timings, self.gc))
        if changed:
            await signal_quietly(liveness_id(self.inp.worker), "gc_status", update)
