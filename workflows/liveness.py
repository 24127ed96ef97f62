"""``WorkerLiveness``: one durable entity workflow per worker (``liveness-{worker}``).

Signal handlers validate and record; the ``run`` loop acts, one named step at a time:
judge the clock (``policy.liveness.transition``), record the state in Postgres, drain, reap
(a ``WorkerReap`` child), stage chunks and forward complete reports to the collector child
(``workflows.intake``), show the state in the Web UI. All I/O is in activities; every rule
is a pure function of ``reaper.core.policy``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ValidationError

    from activities.types import DrainChange
    from reaper.core.contract import (
        KINDS,
        LIVENESS_PREFIX,
        Heartbeat,
        ReasonInput,
        StateView,
        WorkerState,
        liveness_id,
    )
    from reaper.core.models import GcStatusInput, LivenessInput, LivenessState
    from reaper.core.policy import liveness as policy
    from reaper.core.policy.fleet import retire_is_stale
    from workflows import front_door
    from workflows.clock import DEADLINE_SLACK_S, DeadlineTimer, LivenessClock
    from workflows.common import should_continue_as_new
    from workflows.gate import Gate
    from workflows.intake import ReportIntake
    from workflows.liveness_steps import LivenessSteps
    from workflows.run_start import begin_run
    from workflows.view import state_view


@workflow.defn(name="WorkerLiveness")
class WorkerLiveness:
    """Liveness of one worker. Start input ``{"worker": name}``; signals ``heartbeat``,
    ``force_reap``, ``drain`` (CONTRACT.md §2) and, from the collector, ``gc_status``,
    ``want_report``, ``nudge``; query ``state``."""

    @workflow.init
    def __init__(self, *args: Any) -> None:
        inp = self.inp = start_input(args)
        self.live: LivenessState = inp.carried or LivenessState(worker=inp.worker)
        self.intake = ReportIntake(self.live, self._reject)
        self.steps = LivenessSteps(self.live, self.intake)
        self.timer = DeadlineTimer()
        self.clock = LivenessClock(self.live)
        self.gate = Gate(self.live)
        self.early: list[tuple[Callable[[Any], None], Any]] | None = []
        """Signals that arrived before this run loaded its settings (who may speak depends
        on them, §5.2): handled, in order, once they are loaded; ``None`` from then on."""

    def _later(self, handler: Callable[[Any], None], raw: Any) -> bool:
        """Keep ``raw`` for ``handler`` if the settings are not loaded yet (True if kept)."""
        if self.early is None:
            return False
        self.early.append((handler, raw))
        return True

    # ---- signals: validate and record only; never raise, never block ------------------

    @workflow.signal(name="heartbeat")
    def heartbeat(self, *args: Any) -> None:
        """A beat from the agent (CONTRACT.md §2): its first argument. Malformed or
        unauthenticated beats (§5.2) are logged and dropped; further arguments are ignored
        (``workflows.front_door``)."""
        self._heartbeat(front_door.first(args, "heartbeat"))

    def _heartbeat(self, raw: Any) -> None:
        if self._later(self._heartbeat, raw):
            return
        live = self.live
        beat = self._parse(Heartbeat, raw, "heartbeat")
        if beat is None:
            return
        if beat.worker != live.worker:
            self._reject(f"worker {beat.worker!r} sent to the liveness of {live.worker!r}")
            return
        if live.state is WorkerState.retired or beat.boot_id == live.retired_boot_id:
            live.ignored += 1
            workflow.logger.info(
                "ignored beat seq=%s of %s: its boot %s was retired",
                beat.seq,
                live.worker,
                beat.boot_id,
                extra={"worker": live.worker, "action": "ignored", "reason": "retired boot"},
            )
            return
        refused = self.gate.heartbeat(raw if isinstance(raw, dict) else {})
        if refused is not None:
            self._reject(f"heartbeat: {refused}")
            return
        verdict = policy.fence(
            live.boot_id, live.last_seq, live.previous_boot_ids, beat.boot_id, beat.seq
        )
        if not verdict.accepted:
            live.ignored += 1
            workflow.logger.debug(
                "dropped %s beat seq=%s of %s", verdict.value, beat.seq, live.worker
            )
            return
        now = workflow.now()
        if verdict is policy.Fence.new_boot:
            live.previous_boot_ids = policy.remember_boot(live.previous_boot_ids, live.boot_id)
            live.boot_id = beat.boot_id
        stall_after = live.timings.stall_after + DEADLINE_SLACK_S if live.timings else math.inf
        returned = policy.is_return(
            live.state,
            live.last_heartbeat_at,
            now,
            stall_after,
            forced_reap_pending=live.reap_forced and live.reap_request is not None,
        )
        if live.last_heartbeat_at is None:
            live.state_since = now  # running since its first beat
        live.last_seq, live.last_heartbeat_at = beat.seq, now
        if returned:
            self._record_return(now)
        self.intake.take(beat, now, returned)
        self.steps.view.show_details()

    def _record_return(self, now: datetime) -> None:
        """The worker is back: running again, and only reports from now on decide (rule 4)."""
        live = self.live
        live.state, live.state_since = WorkerState.running, now
        live.returned_at = now
        live.grace_until = None
        if not live.reap_forced:
            live.reap_request = None
        live.unforwarded.clear()

    @workflow.signal(name="force_reap")
    def force_reap(self, *args: Any) -> None:
        """Operator: reap this worker now (bypasses the disruption guard, rule 5)."""
        self._force_reap(front_door.first(args, "force_reap"))

    def _force_reap(self, raw: Any) -> None:
        live = self.live
        req = self._operator_request("force_reap", self._force_reap, raw)
        if req is None:
            return
        if live.last_heartbeat_at is None:
            self._reject("force_reap: this worker never sent a valid heartbeat")
            return
        live.reap_request, live.reap_forced, live.reap_retry_at = req, True, None
        if live.state is not WorkerState.lost:
            live.state, live.state_since = WorkerState.lost, workflow.now()

    @workflow.signal(name="drain")
    def drain(self, *args: Any) -> None:
        """Operator: place nothing new on this worker."""
        self._drain(front_door.first(args, "drain"))

    @workflow.signal(name="undrain")
    def undrain(self, *args: Any) -> None:
        """Operator: placements on this worker resume (§5.1)."""
        self._undrain(front_door.first(args, "undrain"))

    def _drain(self, raw: Any) -> None:
        self._set_draining(raw, draining=True)

    def _undrain(self, raw: Any) -> None:
        self._set_draining(raw, draining=False)

    def _set_draining(self, raw: Any, draining: bool) -> None:
        what = "drain" if draining else "undrain"
        req = self._operator_request(what, self._drain if draining else self._undrain, raw)
        if req is not None:
            self.steps.drain_change = DrainChange(
                worker=self.live.worker, draining=draining, reason=req.reason, actor=req.actor
            )

    @workflow.signal(name="retire")
    def retire(self, *args: Any) -> None:
        """Operator or agent: the worker leaves the fleet for good (§5.1), at once."""
        self._retire(front_door.first(args, "retire"))

    def _retire(self, raw: Any) -> None:
        live = self.live
        req = self._operator_request("retire", self._retire, raw)
        if req is None:
            return
        if live.last_heartbeat_at is None or live.state is WorkerState.retired:
            workflow.logger.info("retire of %s ignored: unknown or retired already", live.worker)
            return
        if retire_is_stale(req.boot_id, live.boot_id):
            live.ignored += 1
            workflow.logger.info("retire of %s's boot %s ignored: gone", live.worker, req.boot_id)
            return
        live.retire_request, live.retire_automatic, live.retire_retry_at = req, False, None

    @workflow.signal(name="gc_status")
    def gc_status(self, *args: Any) -> None:
        """From the collector: the latest missing count, orphans and assignments of a kind
        (one ``GcStatusInput``)."""
        inp = front_door.parse(
            GcStatusInput.model_validate, front_door.first(args, "gc_status"), "gc_status"
        )
        if inp is None:
            return
        self.live.collected[inp.kind] = inp.status
        if inp.assignments is not None:
            self.live.assignments = inp.assignments
        self.steps.view.show_details()

    @workflow.signal(name="want_report")
    def want_report(self, *args: Any) -> None:
        """From the collector: a TTL fell due; forward the next report of the kind named."""
        kind = front_door.first(args, "want_report")
        if not isinstance(kind, str) or kind not in KINDS:
            front_door.ignored("malformed", f"want_report: not a kind: {str(kind)[:64]!r}")
            return
        self._want(kind)

    def _want(self, kind: str) -> None:
        if kind not in self.live.wanted:
            self.live.wanted.append(kind)

    @workflow.signal(name="nudge")
    def resync_requested(self, *args: Any) -> None:
        """Postgres changed for this worker (a placement, the change feed): reconcile its next
        reports of the kinds named (a list of kind names; every kind when absent)."""
        kinds = front_door.first(args, "nudge")
        wanted = [k for k in kinds if k in KINDS] if isinstance(kinds, list) else KINDS
        for kind in wanted:
            self._want(kind)

    @workflow.signal(name="gc_stopped")
    def gc_stopped(self, *args: Any) -> None:
        """From the collector: it ended after this liveness retired its worker."""
        front_door.first(args, "gc_stopped")
        self.steps.retirement.collector_stopped = True

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """A signal of a name this liveness does not know (a newer sender's): ignored,
        logged and counted, never buffered."""
        front_door.unknown_signal(name, len(args))

    @workflow.query(name="state")
    def state(self, *args: Any) -> StateView:
        """Current view (CONTRACT.md §2 query ``state``); arguments are ignored."""
        return state_view(self.live, self.intake.backlog())

    # ---- the loop ------------------------------------------------------------------------

    @workflow.run
    async def run(self, *args: Any) -> None:
        """The loop; ``args`` are the start input, parsed once in ``__init__``."""
        inp, live = self.inp, self.live
        if workflow.info().workflow_id != liveness_id(live.worker):
            # Started by someone else under another id: it would speak for a worker whose
            # liveness it is not (§5.2). It does nothing.
            workflow.logger.warning(
                "%s is not the liveness of %s: ending", workflow.info().workflow_id, live.worker
            )
            return
        record, self.steps.local_writes, self.steps.refresh_at_bound = await begin_run(
            live, self.gate, self.intake, first=inp.carried is None
        )
        early, self.early = self.early or [], None
        for handler, raw in early:
            handler(raw)
        self.steps.view.show_details()  # dropped at continue-as-new: shown again
        if inp.carried is None and not await self.steps.retirement.registers_afresh(record):
            return
        while True:
            await self.steps.step(self.clock.judge)
            if live.state is WorkerState.retired:
                self.timer.cancel()
                await self.steps.retirement.end()
                return
            # Operator requests and chunks live outside the carried state: hand over only
            # once they are handled (a signal in this very activation is seen here).
            if (
                should_continue_as_new()
                and not self.intake.chunks
                and self.steps.drain_change is None
            ):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(LivenessInput(worker=live.worker, carried=live))
            fired = await self.timer.wait(
                self.clock.next_deadline(),
                self._has_work,
                f"{live.state.value}: next liveness deadline",
            )
            if fired is not None:
                self.clock.on_deadline(fired)

    def _has_work(self) -> bool:
        return self.steps.has_work() or should_continue_as_new()

    # ---- helpers -------------------------------------------------------------------------

    def _reject(self, reason: str) -> None:
        self.live.rejected += 1
        self.live.last_rejection = reason
        fields = {"worker": self.live.worker, "action": "rejected", "reason": reason}
        workflow.logger.warning("rejected input for %s: %s", self.live.worker, reason, extra=fields)
        if not workflow.unsafe.is_replaying():  # a replay must not count it again (§5.4)
            with workflow.unsafe.imports_passed_through():
                from activities.metrics import count_rejected
            count_rejected()

    def _operator_request(
        self, what: str, handler: Callable[[Any], None], raw: Any
    ) -> ReasonInput | None:
        """An operator signal's request, or ``None`` if it is kept for later, malformed, or
        not authenticated (``required`` mode, §5.2); rejections are logged."""
        if self._later(handler, raw):
            return None
        req: ReasonInput | None = self._parse(ReasonInput, raw if raw is not None else {}, what)
        if req is None:
            return None
        refused = self.gate.operator(what, raw)
        if refused is not None:
            self._reject(refused)
            return None
        return req

    def _parse(self, model: type[Any], raw: Any, what: str) -> Any:
        """``raw`` validated as ``model``, or ``None`` (rejected, logged) if malformed."""
        try:
            parsed: BaseModel = model.model_validate(raw)
            return parsed
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ())) or "payload"
            self._reject(f"{what}: {where}: {err.get('msg')}")
            return None


def start_input(args: Sequence[Any]) -> LivenessInput:
    """The start input ``{"worker": name}`` (CONTRACT.md §2), or the carried state of a
    continue-as-new. One that does not parse is ignored (logged, counted): the worker is then
    the one this workflow's id names, ``liveness-{worker}``, so a bad start never wedges a
    worker's liveness (a run whose id names no worker ends at once)."""
    raw = front_door.first(args, "start input")
    inp = front_door.parse(LivenessInput.model_validate, raw, "start input", "malformed-start")
    if inp is not None:
        return inp
    return LivenessInput(worker=front_door.worker_from_id(LIVENESS_PREFIX) or "")
