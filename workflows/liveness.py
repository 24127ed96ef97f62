"""``WorkerLiveness``: one durable entity workflow per worker (``liveness-{worker}``).

It judges the worker ``running``, ``stalled`` or ``lost`` on the controller's clock with a
single deadline timer, fences heartbeats by ``boot_id`` and ``seq``, hands changed complete
reports to its collector child (``gc-{worker}``) and starts a reap child
(``reap-{worker}-{n}``) when the worker is lost or an operator forces it. All I/O is in
activities; the signal handlers only record, the ``run`` loop acts.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

from temporalio import workflow
from temporalio.exceptions import WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from activities import ReaperActivities
    from activities.types import DrainChange, FleetView, StageChunk, WorkerStateChange
    from reaper.core.policy import collection, liveness
    from reaper.core import protocol
    from reaper.core.contract import KINDS, Heartbeat, ReasonInput, ReportChunk, StateView, WorkerState
    from reaper.core.models import CollectorInput, GcStatusInput, LivenessInput, LivenessState, ReapInput, ReapResult, Report, Staging, Timings
    from workflows.collector import HandleCollector
    from workflows.common import (
        ACTIVITY_TIMEOUT,
        MISSING_ATTR,
        RETRY,
        STATE_ATTR,
        WORKER_ATTR,
        collector_id,
        reap_id,
    )
    from workflows.reap import WorkerReap

HISTORY_CAP = 8_000
"""Continue-as-new at this many events even if the server has not suggested it (issue 4:
no run above 10,000)."""
DEADLINE_SLACK_S = 0.25
"""Liveness timers fire this long after their deadline (see ``_wait``)."""
STAGE_PARALLEL = 4
"""Chunks of one report staged at once (each holds a Postgres connection meanwhile)."""
INLINE_KEEP_BYTES = 64 * 1024
"""A report larger than this (JSON bytes of its handles) is staged in Postgres, not kept in
workflow state or sent to the collector in a signal (issue 4: no payload over 256 KiB)."""

_RANK = {WorkerState.running: 0, WorkerState.stalled: 1, WorkerState.lost: 2}


@workflow.defn(name="WorkerLiveness")
class WorkerLiveness:
    """Liveness of one worker. Start input ``{"worker": name}``; signals ``heartbeat``,
    ``force_reap``, ``drain``, ``gc_status``, ``want_report``, ``nudge``; query ``state``."""

    @workflow.init
    def __init__(self, inp: LivenessInput) -> None:
        self.s: LivenessState = inp.carried or LivenessState(worker=inp.worker)
        self._drain: ReasonInput | None = None
        self._attrs: tuple[str, int] | None = None
        self._deadline: datetime | None = None
        # Chunks of large reports waiting to be staged; never carried across
        # continue-as-new (the loop stages them all before it continues).
        self._chunks: list[tuple[ReportChunk, datetime, str, bool]] = []
        self._staging_busy = 0
        self._timer: asyncio.Future[None] | None = None
        self._timer_deadline = datetime.min.replace(tzinfo=timezone.utc)
        self._fleet_seen: str | None = None
        """Fleet state returned by the record of this step (consumed by ``_reap``)."""

    # ---- signals: record only, never raise, never block -------------------------------

    @workflow.signal(name="heartbeat")
    def heartbeat(self, raw: Any) -> None:
        """A beat from the agent (CONTRACT.md §2). Malformed beats are logged and dropped."""
        s = self.s
        try:
            beat = Heartbeat.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ())) or "payload"
            self._reject(f"{where}: {err.get('msg')}")
            return
        if beat.worker != s.worker:
            self._reject(f"worker {beat.worker!r} sent to the liveness of {s.worker!r}")
            return
        verdict = liveness.fence(s.boot_id, s.last_seq, s.previous_boot_ids, beat.boot_id, beat.seq)
        if not verdict.accepted:
            s.ignored += 1
            workflow.logger.debug("dropped %s beat seq=%s of %s", verdict.value, beat.seq, s.worker)
            return
        now = workflow.now()
        if verdict is liveness.Fence.new_boot:
            s.previous_boot_ids = liveness.remember_boot(s.previous_boot_ids, s.boot_id)
            s.boot_id = beat.boot_id
        # A silence of STALL_AFTER is a stall even if the loop, busy with an activity, had no
        # chance to judge it (same boundary as the deadline timer, so a replay agrees).
        silent = (s.last_heartbeat_at is not None and s.timings is not None
                  and (now - s.last_heartbeat_at).total_seconds()
                  >= s.timings.stall_after + DEADLINE_SLACK_S)
        if s.last_heartbeat_at is None:
            s.state_since = now  # running since its first beat
        s.last_seq = beat.seq
        s.last_heartbeat_at = now
        returned = s.state is not WorkerState.running or silent
        if s.reap_forced and s.reap_pending is not None:
            # An operator's reap runs first, even if the worker is beating: it stays lost
            # until the reap is done, and its first beat after that is its return.
            returned = False
        if returned:
            s.state, s.state_since = WorkerState.running, now
            s.returned_at = now
            s.grace_until = None
            if not s.reap_forced:
                s.reap_pending = None
            # Reports taken before the return never decide (rule 4): the first complete
            # report from now on does.
            s.pending.clear()
        for kind in KINDS:
            handles = beat.report(kind)
            if handles is not None:
                self._offer(Report(kind=kind, handles=handles, taken_at=now, boot_id=beat.boot_id,
                                   digest=protocol.report_digest(handles)), force=returned)
            elif beat.digests and kind in beat.digests:
                # "Unchanged, and this is its digest": a complete report if the controller
                # holds that very report; otherwise liveness only (the agent resends).
                known = self._known_report(kind, beat.digests[kind])
                if known is not None:
                    self._offer(known.model_copy(update={
                        "taken_at": now, "boot_id": beat.boot_id, "also_seen": [],
                        "restart_all": False}), force=returned)
        if beat.chunk is not None:
            self._chunks.append((beat.chunk, now, beat.boot_id, returned))

    @workflow.signal(name="force_reap")
    def force_reap(self, raw: Any) -> None:
        """Operator: reap this worker now (bypasses the disruption guard, rule 5)."""
        s = self.s
        req = self._reason(raw)
        if req is None:
            return
        if s.last_heartbeat_at is None:
            self._reject("force_reap: this worker never sent a valid heartbeat")
            return
        s.reap_pending, s.reap_forced, s.reap_retry_at = req, True, None
        if s.state is not WorkerState.lost:
            s.state, s.state_since = WorkerState.lost, workflow.now()

    @workflow.signal(name="drain")
    def drain(self, raw: Any) -> None:
        """Operator: place nothing new on this worker."""
        req = self._reason(raw)
        if req is not None:
            self._drain = req

    @workflow.signal(name="gc_status")
    def gc_status(self, inp: GcStatusInput) -> None:
        """From the collector: the latest missing count, orphans and assignments of a kind."""
        self.s.status[inp.kind] = inp.status
        if inp.assignments is not None:
            self.s.assignments = inp.assignments

    @workflow.signal(name="want_report")
    def want_report(self, kind: str) -> None:
        """From the collector: a TTL fell due; forward the next report of ``kind``."""
        if kind in KINDS and kind not in self.s.wanted:
            self.s.wanted.append(kind)

    @workflow.signal(name="nudge")
    def nudge(self, _: Any = None) -> None:
        """Something changed in Postgres for this worker (a placement): resync next report."""
        for kind in KINDS:
            self.want_report(kind)

    @workflow.query(name="state")
    def state(self) -> StateView:
        """Current view (CONTRACT.md §2 query ``state``)."""
        s = self.s
        missing = {k: st.missing for k, st in s.status.items()}
        orphans = sorted({h for st in s.status.values() for h in st.orphans})
        return StateView(
            worker=s.worker, state=s.state.value, boot_id=s.boot_id,
            last_seq=s.last_seq if s.last_seq >= 0 else None,
            last_heartbeat_at=s.last_heartbeat_at, missing=sum(missing.values()),
            assignments=list(s.assignments), orphans=orphans, draining=s.draining,
            state_since=s.state_since, rejected=s.rejected, last_rejection=s.last_rejection,
            ignored=s.ignored,
            missing_by_kind=missing,
            pending_reports=len(s.pending) + len(self._chunks) + self._staging_busy,
            orphans_by_kind={k: list(st.orphans) for k, st in s.status.items() if st.orphans},
            report_digests={k: r.digest for k in KINDS
                            if (r := s.pending.get(k) or s.last_reports.get(k)) is not None},
            forwarded_reports=s.forwarded,
        )

    # ---- the loop ------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: LivenessInput) -> None:
        s = self.s
        s.timings = await workflow.execute_local_activity_method(
            ReaperActivities.load_timings, start_to_close_timeout=timedelta(seconds=10)
        )
        workflow.set_current_details(
            f"Liveness of worker **{s.worker}**: stalled after {s.timings.stall_after:g}s, "
            f"lost after {s.timings.lost_after:g}s without a heartbeat; handle GC in "
            f"`{collector_id(s.worker)}`."
        )
        while True:
            await self._step()
            # Operator requests and chunks live outside the carried state: hand over only
            # once they are handled (a signal in this very activation is seen here).
            if self._should_continue_as_new() and not self._chunks and self._drain is None:
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(LivenessInput(worker=s.worker, carried=s))
            await self._wait()

    def _t(self) -> Timings:
        assert self.s.timings is not None
        return self.s.timings

    def _should_continue_as_new(self) -> bool:
        info = workflow.info()
        return info.is_continue_as_new_suggested() or info.get_current_history_length() >= HISTORY_CAP

    def _need_record(self) -> bool:
        s = self.s
        return s.last_heartbeat_at is not None and (
            s.recorded_state is not s.state
            or (s.state is WorkerState.running and s.recorded_return != s.returned_at))

    def _need_reap(self) -> bool:
        s = self.s
        return (s.reap_pending is not None and s.reap_retry_at is None
                and s.recorded_state is WorkerState.lost)

    def _need_forward(self) -> bool:
        s = self.s
        return (bool(s.pending) and s.recorded_state is WorkerState.running
                and s.recorded_return == s.returned_at)

    def _has_work(self) -> bool:
        return (
            self._need_record()
            or self._need_reap()
            or self._drain is not None
            or self._need_forward()
            or bool(self._chunks)
            or self._attrs != self._attr_values()
            or self._should_continue_as_new()
        )

    def _next_deadline(self) -> datetime | None:
        s, t = self.s, self._t()
        times = []
        if s.last_heartbeat_at is not None:
            d = liveness.next_deadline(s.last_heartbeat_at, s.state, t.stall_after, t.lost_after,
                                    s.grace_until)
            if d is not None:
                times.append(d)
        if s.reap_retry_at is not None:
            times.append(s.reap_retry_at)
        return min(times) if times else None

    async def _wait(self) -> None:
        """Wait for work or the next liveness deadline, with at most one timer running.

        A heartbeat moves the deadline later but does not touch the timer: when it fires
        early, the loop finds the worker still running and sets the next one. Timers are
        cancelled only when a deadline moves earlier, so steady beats cost no timer events
        beyond one per ``STALL_AFTER`` (TEMPORAL.md: a timer restarted per beat costs about
        two events a beat).
        """
        if self._has_work():
            return
        deadline = self._next_deadline()
        if deadline is None:
            await workflow.wait_condition(self._has_work)
            return
        # Fire a little after the deadline, never on it: workflow.now() of one activation
        # can differ by milliseconds between the first run and a replay (seen when the SDK
        # regroups back-to-back workflow tasks), and a decision taken on the boundary itself
        # would then differ too: a non-determinism error.
        fire_at = deadline + timedelta(seconds=DEADLINE_SLACK_S)
        delay = (fire_at - workflow.now()).total_seconds()
        if delay <= 0:
            self._on_deadline(deadline)
            return
        timer = self._timer
        if timer is None or timer.done() or self._timer_deadline > deadline:
            if timer is not None and not timer.done():
                timer.cancel()
            self._timer_deadline = deadline
            self._timer = timer = asyncio.ensure_future(workflow.sleep(
                delay, summary=f"{self.s.state.value}: next liveness deadline"))
        await workflow.wait_condition(lambda: self._has_work() or timer.done())
        if timer.done():
            self._timer = None
            self._on_deadline(self._timer_deadline)

    def _on_deadline(self, deadline: datetime) -> None:
        s, t = self.s, self._t()
        now = workflow.now()
        grace = liveness.outage_grace(deadline, now, t.heartbeat_interval, t.stall_after)
        if grace is not None and s.state is not WorkerState.lost:
            # The timer fired late: the controller or Temporal was down, so the worker's
            # silence is no evidence (issue 3, rule 4). Give it STALL_AFTER to beat again.
            s.grace_until = max(grace, s.grace_until or grace)
            workflow.logger.warning("deadline of %s fired %ss late: grace until %s",
                                    s.worker, (now - deadline).total_seconds(), s.grace_until)
        if s.reap_retry_at is not None and now >= s.reap_retry_at:
            s.reap_retry_at = None

    def _judge(self) -> None:
        """Move ``running`` -> ``stalled`` -> ``lost`` as the clock says; only beats go back."""
        s, t = self.s, self._t()
        if s.last_heartbeat_at is None:
            return
        now = workflow.now()
        deadline = liveness.next_deadline(s.last_heartbeat_at, s.state, t.stall_after, t.lost_after,
                                       s.grace_until)
        if (deadline is not None and deadline < now
                and workflow.patched("outage-grace-when-judged")):
            # Judged late, however the loop got here (a late timer, a run that starts after
            # the controller was down across a continue-as-new, a signal that woke the loop
            # first): the same outage grace as a late timer (rule 4).
            self._on_deadline(deadline)
        judged = liveness.judge_liveness(s.last_heartbeat_at, now, t.stall_after, t.lost_after)
        if judged is WorkerState.lost and s.grace_until is not None and now < s.grace_until:
            judged = WorkerState.stalled
        if _RANK[judged] <= _RANK[s.state]:
            return
        s.state, s.state_since = judged, now
        if judged is WorkerState.lost and s.reap_pending is None:
            s.reap_pending = ReasonInput(
                reason=f"no heartbeat for {t.lost_after:g}s", actor="reaper"
            )
            s.reap_forced = False

    async def _step(self) -> None:
        s = self.s
        self._fleet_seen = None
        self._judge()
        if self._need_record():
            await self._record_state()
        if self._drain is not None:
            req, self._drain = self._drain, None
            changed = await workflow.execute_activity_method(
                ReaperActivities.set_draining,
                DrainChange(worker=s.worker, draining=True, reason=req.reason, actor=req.actor),
                start_to_close_timeout=ACTIVITY_TIMEOUT, retry_policy=RETRY,
                summary=f"drain {s.worker}",
            )
            s.draining, s.drain_reason = True, req.reason
            workflow.logger.info("drain of %s (changed=%s): %s", s.worker, changed, req.reason)
        if self._need_reap():
            await self._reap()
        if self._chunks:
            self._staging_busy = 1
            try:
                await self._stage_chunks()
            finally:
                self._staging_busy = 0
        if self._need_forward():
            await self._forward()
        await self._upsert_attributes()

    async def _record_state(self) -> None:
        s = self.s
        state = s.state
        reason = None
        actor = None
        if state is WorkerState.lost and s.reap_pending is not None:
            reason, actor = s.reap_pending.reason, s.reap_pending.actor
        back = s.returned_at if state is WorkerState.running else None
        done: FleetView = await workflow.execute_activity_method(
            ReaperActivities.record_worker_state,
            WorkerStateChange(
                worker=s.worker, state=state, at=s.state_since or workflow.now(),
                boot_id=s.boot_id, last_seq=s.last_seq if s.last_seq >= 0 else None,
                last_heartbeat_at=s.last_heartbeat_at, reason=reason, actor=actor,
                returned_at=back,
            ),
            start_to_close_timeout=ACTIVITY_TIMEOUT, retry_policy=RETRY,
            summary=f"{s.worker}: {s.recorded_state.value if s.recorded_state else 'new'} -> {state.value}",
        )
        s.recorded_state = state
        if state is WorkerState.running:
            s.recorded_return = back
        s.registered = True
        self._fleet_seen = done.state
        if done.marks_cleared:
            # The return cleared every mark in Postgres: the missing counts shown (query
            # `state`, ReaperMissing) are 0 until the next report says otherwise.
            for st in s.status.values():
                st.missing, st.next_due = 0, None

    async def _reap(self) -> None:
        s = self.s
        req = s.reap_pending
        assert req is not None
        seen, self._fleet_seen = self._fleet_seen, None
        if not s.reap_forced:
            # While the fleet is in full disruption, wait without starting a reap child per
            # attempt (the reap activity checks again, in its transaction, anyway). The fleet
            # state written with `lost` a moment ago is fresh enough; a retry asks again.
            # (patched: runs recorded before it asked the fleet every time)
            if seen is None or not workflow.patched("reap-uses-recorded-fleet-state"):
                seen = (await workflow.execute_activity_method(
                    ReaperActivities.fleet_status, workflow.now(),
                    start_to_close_timeout=ACTIVITY_TIMEOUT, retry_policy=RETRY,
                    summary="fleet disruption check before reaping",
                )).state
            if seen == "full":
                s.reap_retry_at = workflow.now() + timedelta(seconds=self._t().stall_after)
                workflow.logger.warning("reap of %s deferred: fleet in full disruption",
                                        s.worker)
                return
        s.reaps += 1
        result: ReapResult = await workflow.execute_child_workflow(
            WorkerReap.run,
            ReapInput(worker=s.worker, reason=req.reason, actor=req.actor, forced=s.reap_forced,
                      lost_after=self._t().lost_after, last_heartbeat_at=s.last_heartbeat_at,
                      dry_run=self._t().dry_run),
            id=reap_id(s.worker, s.reaps),
            static_summary=f"reap {s.worker}: {req.reason}",
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
        )
        if result.refused is not None:
            retry = result.retry_at or workflow.now() + timedelta(seconds=self._t().stall_after)
            s.reap_retry_at = max(retry, workflow.now() + timedelta(seconds=1))
            workflow.logger.warning("reap of %s refused: %s; retry at %s",
                                    s.worker, result.refused, s.reap_retry_at)
            if s.reap_forced:  # forced reaps are refused only for unknown workers: give up
                s.reap_pending, s.reap_forced, s.reap_retry_at = None, False, None
            return
        s.reap_pending, s.reap_forced = None, False
        s.reaped_boot_id = s.boot_id

    def _offer(self, report: Report, force: bool) -> None:
        """Queue a complete report for the collector if it needs reconciling (issue 4)."""
        s = self.s
        kind = report.kind
        if s.returned_at is not None and report.taken_at < s.returned_at:
            return  # taken before the latest return (a chunked report finished late)
        queued = s.pending.get(kind)
        if queued is not None:
            if queued.digest == report.digest and not force:
                return
            if queued.staged is not None or report.staged is not None or queued.restart_all:
                report.restart_all = True   # handles not at hand: restart every mark
            else:
                report.also_seen = collection.coalesce(queued.handles, queued.also_seen,
                                                  report.handles)
            s.pending[kind] = report
            return
        wanted = kind in s.wanted
        decision = collection.should_forward(
            report.digest, s.forwarded_digest.get(kind), report.taken_at,
            # Half a heartbeat early: beats come at near-multiples of the interval, so the
            # decision never sits on a boundary that a replay could see a few ms apart.
            s.forwarded_at.get(kind),
            (t.resync_interval - t.heartbeat_interval / 2) if (t := s.timings) else 0.0,
            wanted or force,
        )
        if decision.forward:
            s.pending[kind] = report

    def _known_report(self, kind: str, digest: str) -> Report | None:
        """The complete report of ``kind`` with ``digest`` that this liveness holds, if any."""
        for report in (self.s.pending.get(kind), self.s.last_reports.get(kind)):
            if report is not None and report.digest == digest:
                return report
        return None

    async def _stage_chunks(self) -> None:
        """Stage queued chunks in Postgres; a report whose last chunk is in is offered.

        Consecutive chunks of one report are staged up to ``STAGE_PARALLEL`` at a time (one
        activity each, every payload under 128 KiB): a 100,000-handle report is ~50 chunks,
        and one activity round trip each in sequence dominated its end-to-end time.
        """
        s = self.s
        parallel = STAGE_PARALLEL if workflow.patched("parallel-chunk-staging") else 1
        while self._chunks:
            batch = [self._chunks.pop(0)]
            first = batch[0][0]
            while (len(batch) < parallel and self._chunks
                   and (self._chunks[0][0].kind, self._chunks[0][0].report_id)
                   == (first.kind, first.report_id)):
                batch.append(self._chunks.pop(0))
            jobs = []
            for chunk, at, boot_id, returned in batch:
                st = s.staging.get(chunk.kind)
                if st is None or st.report_id != chunk.report_id:
                    st = Staging(report_id=chunk.report_id, count=chunk.count,
                                 digest=chunk.digest, taken_at=at, boot_id=boot_id)
                    s.staging[chunk.kind] = st
                if (chunk.count, chunk.digest) != (st.count, st.digest):
                    self._reject(f"chunk {chunk.index} of report {chunk.report_id} disagrees "
                                 "with its first chunk on count or digest")
                    continue
                last = s.last_reports.get(chunk.kind)
                handle = workflow.start_activity_method(
                    ReaperActivities.stage_chunk,
                    StageChunk(worker=s.worker, kind=chunk.kind, report_id=chunk.report_id,
                               index=chunk.index, count=chunk.count, digest=chunk.digest,
                               handles=chunk.handles, keep=last.staged if last else None),
                    start_to_close_timeout=ACTIVITY_TIMEOUT, retry_policy=RETRY,
                    summary=f"stage {chunk.kind} chunk {chunk.index + 1}/{chunk.count}",
                )
                jobs.append((chunk, st, returned, handle))
            results = await asyncio.gather(*(job[3] for job in jobs))
            for (chunk, st, returned, _), res in zip(jobs, results):
                st.staged = max(st.staged, res.staged)
                if not res.complete:
                    continue
                if s.staging.get(chunk.kind) is st:
                    del s.staging[chunk.kind]
                if not res.digest_ok:
                    self._reject(f"chunked report {chunk.report_id}: handles do not match digest")
                    continue
                self._offer(Report(kind=chunk.kind, handles=[], staged=chunk.report_id,
                                   taken_at=st.taken_at, boot_id=st.boot_id, digest=st.digest),
                            force=returned)

    async def _stage_inline(self, report: Report) -> Report:
        """A plain report too large to keep in workflow state is staged like a chunked one."""
        s = self.s
        report_id = f"inline-{s.forwarded}-{report.digest[:12]}"
        chunks = protocol.chunk_handles(report.handles, INLINE_KEEP_BYTES)
        last = s.last_reports.get(report.kind)
        for i, part in enumerate(chunks):
            await workflow.execute_activity_method(
                ReaperActivities.stage_chunk,
                StageChunk(worker=s.worker, kind=report.kind, report_id=report_id, index=i,
                           count=len(chunks), digest=report.digest, handles=part,
                           keep=last.staged if last else None),
                start_to_close_timeout=ACTIVITY_TIMEOUT, retry_policy=RETRY,
                summary=f"stage large {report.kind} report {i + 1}/{len(chunks)}",
            )
        return report.model_copy(update={"handles": [], "staged": report_id})

    async def _forward(self) -> None:
        s = self.s
        reports = []
        for kind in KINDS:
            r = s.pending.get(kind)
            if r is None:
                continue
            if r.staged is None and protocol.payload_bytes(r.handles) > INLINE_KEEP_BYTES:
                r = await self._stage_inline(r)
            if s.pending.get(kind) is not None and s.pending[kind].taken_at > r.taken_at:
                continue  # superseded while staging: forward the newer one next round
            s.pending.pop(kind, None)
            reports.append(r)
            s.last_reports[kind] = r.model_copy(update={"also_seen": [], "restart_all": False})
        if not reports:
            return
        s.forwarded += len(reports)
        for r in reports:
            s.forwarded_digest[r.kind] = r.digest
            s.forwarded_at[r.kind] = r.taken_at
            if r.kind in s.wanted:
                s.wanted.remove(r.kind)
        if not s.collector_started:
            await self._start_collector(reports)
            return
        try:
            await workflow.get_external_workflow_handle(collector_id(s.worker)).signal(
                "report", reports
            )
        except Exception as exc:  # collector gone (terminated by hand): start a new one
            workflow.logger.warning("collector of %s unreachable (%s); restarting it", s.worker, exc)
            await self._start_collector(reports)

    async def _start_collector(self, reports: list[Report]) -> None:
        s = self.s
        try:
            await workflow.start_child_workflow(
                HandleCollector.run,
                CollectorInput(worker=s.worker, timings=self._t(), queued=reports),
                id=collector_id(s.worker),
                static_summary=f"handle GC of {s.worker}",
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            )
        except WorkflowAlreadyStartedError:
            await workflow.get_external_workflow_handle(collector_id(s.worker)).signal(
                "report", reports
            )
        s.collector_started = True

    def _attr_values(self) -> tuple[str, int]:
        s = self.s
        shown = s.state.value
        if s.draining and s.state is WorkerState.running:
            shown = "draining"
        return shown, sum(st.missing for st in s.status.values())

    async def _upsert_attributes(self) -> None:
        values = self._attr_values()
        if values == self._attrs:
            return
        self._attrs = values
        workflow.upsert_search_attributes([
            WORKER_ATTR.value_set(self.s.worker),
            STATE_ATTR.value_set(values[0]),
            MISSING_ATTR.value_set(values[1]),
        ])

    # ---- helpers -------------------------------------------------------------------------

    def _reject(self, reason: str) -> None:
        self.s.rejected += 1
        self.s.last_rejection = reason
        workflow.logger.warning("rejected heartbeat for %s: %s", self.s.worker, reason)

    def _reason(self, raw: Any) -> ReasonInput | None:
        try:
            return ReasonInput.model_validate(raw if raw is not None else {})
        except ValidationError as exc:
            self._reject(f"operator signal: {exc.errors()[0].get('msg')}")
            return None
