"""``WorkerLiveness``: one durable entity workflow per worker (``liveness-{worker}``).

All of a run's state is one value, ``LivenessState``, and every decision is
``reaper.core.policy.liveness_machine.decide``'s: the handlers parse what arrives and hand it
over as an event; the ``run`` loop looks at the clock (an event too), then runs the steps
that are due, in their fixed order (``workflows.liveness_steps``), each an activity or a
child. All I/O is in activities; no rule is decided here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ValidationError

    from reaper.core.contract import (
        KINDS,
        Heartbeat,
        StateView,
        WorkerState,
        liveness_id,
    )
    from reaper.core.kinds import TASKS
    from reaper.core.liveness_state import LivenessInput, LivenessState, RunFeatures
    from reaper.core.models import DeadlinesView, GcStatusInput
    from reaper.core.policy import liveness_machine as machine
    from reaper.core.policy import rollout
    from workflows import front_door, hooks
    from workflows.clock import DeadlineTimer
    from workflows.common import should_continue_as_new
    from workflows.gate import Gate
    from workflows.intake import ReportIntake
    from workflows.liveness_steps import LivenessSteps
    from workflows.operator import OperatorCommands, OperatorHandlers
    from workflows.run_start import begin_run, start_input
    from workflows.view import deadlines_view, state_view


@workflow.defn(name="WorkerLiveness")
class WorkerLiveness(OperatorHandlers):
    """Liveness of one worker. Start input ``{"worker": name}``; signals ``heartbeat``,
    ``force_reap``, ``drain``, ``undrain``, ``retire`` (CONTRACT.md §2, §5.1) and, from the
    collector, ``gc_status``, ``want_report``, ``nudge``, ``gc_stopped``; query ``state``.
    Every handler takes any arguments (``workflows.front_door``)."""

    @workflow.init
    def __init__(self, *args: Any) -> None:
        inp = self.inp = start_input(args)
        live = self.live = inp.carried or LivenessState(worker=inp.worker)
        # What belongs to a run starts afresh with each (it is decided again at its start).
        live.features, live.early, live.shown = RunFeatures(), [], None
        self.intake = ReportIntake(live, self._reject)
        self.steps = LivenessSteps(live, self.intake)
        self.timer = DeadlineTimer()
        self.gate = Gate(live)
        self.ops = OperatorCommands(live, self.gate, self._reject)
        self.drained_early: bool | None = None
        """``drained`` of a ``gc_status`` taken before this run decided its features: the
        collector says a value once, so it is applied once they are (a run that dropped it
        showed ``draining`` until the next change of the tasks status)."""

    # ---- signals: parse and hand over; never raise, never block ------------------------

    @workflow.signal(name="heartbeat")
    def heartbeat(self, *args: Any) -> None:
        """A beat from the agent (CONTRACT.md §2): its first argument. Malformed or
        unauthenticated beats (§5.2) are logged and dropped; further arguments are ignored
        (``workflows.front_door``)."""
        self._heartbeat(front_door.first(args, "heartbeat"))

    def _heartbeat(self, raw: Any) -> None:
        if self.ops.later("heartbeat", raw):
            return
        live = self.live
        beat = self._parse(Heartbeat, raw, "heartbeat")
        if beat is None:
            return
        now = workflow.now()
        admitted = machine.decide(live, now, machine.Beat(beat)).outcome
        if admitted.verdict == "rejected":
            self._reject(admitted.reason or "heartbeat")
            return
        if admitted.verdict == "ignored":
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
        fenced = machine.decide(live, now, machine.Authenticated(beat)).outcome
        if fenced.verdict == "ignored":
            workflow.logger.debug(
                "dropped %s beat seq=%s of %s", fenced.reason, beat.seq, live.worker
            )
            return
        self.intake.take(beat, now, fenced.verdict == "returned")
        self.steps.view.show_details()

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
        if inp.drained is not None:
            if self.live.early is not None:  # the run's features are decided at its start
                self.drained_early = inp.drained
            elif self.live.features.uses(rollout.ROTATING_HOSTS):
                machine.decide(self.live, workflow.now(), machine.Drained(inp.drained))
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
        reports of the kinds named (a list of kind names; every kind when absent).

        Every kind is named only by the fleet monitor telling a worker of tasks it placed
        (``tell_placed``). A ``rotating-hosts`` run then also reconciles the tasks report it
        holds at once (``Intake.recheck_held``), so that the ``state`` read after the
        worker's next beat lists the placement, one beat sooner than the next report's
        reconcile would (BENCHMARKS.md metrics 10a, 10b)."""
        kinds = front_door.first(args, "nudge")
        wanted = [k for k in kinds if k in KINDS] if isinstance(kinds, list) else KINDS
        for kind in wanted:
            self._want(kind)
        if kinds is None and self.live.features.uses(rollout.ROTATING_HOSTS):
            self.intake.recheck_held(TASKS.report)

    @workflow.signal(name="gc_stopped")
    def gc_stopped(self, *args: Any) -> None:
        """From the collector: it ended after this liveness retired its worker."""
        front_door.first(args, "gc_stopped")
        self.live.collector_stopped = True

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """A signal of a name this liveness does not know (a newer sender's): ignored,
        logged and counted, never buffered."""
        front_door.unknown_signal(name, len(args))

    @workflow.query(name="state")
    def state(self, *args: Any) -> StateView:
        """Current view (CONTRACT.md §2 query ``state``); arguments are ignored."""
        return state_view(self.live, self.intake.backlog())

    @workflow.query(name="deadlines")
    def deadlines(self, *args: Any) -> DeadlinesView:
        """When the controller next judges the worker, and with which settings (``reaper
        explain``); arguments are ignored."""
        return deadlines_view(self.live)

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
        record = await begin_run(live, self.gate, first=inp.carried is None)
        early, live.early = live.early or [], None
        for name, raw in early:
            if name == "heartbeat":
                self._heartbeat(raw)
            else:
                self.ops.signal(name, raw)
        if self.drained_early is not None and live.features.uses(rollout.ROTATING_HOSTS):
            machine.decide(live, workflow.now(), machine.Drained(self.drained_early))
        self.steps.view.show_details()  # dropped at continue-as-new: shown again
        if inp.carried is None and not await self.steps.retirement.registers_afresh(record):
            return
        while True:
            await self.steps.step()
            if live.state is WorkerState.retired:
                self.timer.cancel()
                await self.steps.retirement.end()
                await workflow.wait_condition(workflow.all_handlers_finished)
                return
            if self._hands_over():
                workflow.continue_as_new(LivenessInput(worker=live.worker, carried=live))
            # rearm-on-beat: the beat before the timer would fire re-arms it.
            t = live.timings
            fired = await self.timer.wait(
                self._next_deadline,
                self._has_work,
                f"{live.state.value}: next liveness deadline",
                rearm_within=t.heartbeat_interval if t else None,
            )
            if fired is not None:
                for note in machine.deadline_passed(live, fired, workflow.now()):
                    workflow.logger.warning("%s: %s", live.worker, note)

    def _next_deadline(self) -> datetime | None:
        return machine.next_deadline(self.live)

    def _has_work(self) -> bool:
        return bool(machine.due_steps(self.live)) or self._hands_over()

    def _hands_over(self) -> bool:
        """Whether the run continues as new now: suggested, with drains and chunks applied
        (a signal in this very activation is seen here) and no update still waiting for
        the loop to carry it out (an update answers once its step ran; waiting for it here
        would wait for ever)."""
        live = self.live
        return (
            should_continue_as_new()
            and not live.chunks
            and not live.drains
            and workflow.all_handlers_finished()
        )

    # ---- helpers -------------------------------------------------------------------------

    def _reject(self, reason: str) -> None:
        self.live.rejected += 1
        self.live.last_rejection = reason
        fields = {"worker": self.live.worker, "action": "rejected", "reason": reason}
        workflow.logger.warning("rejected input for %s: %s", self.live.worker, reason, extra=fields)
        hooks.count_rejected()  # once, never again on replay (§5.4)

    def _parse(self, model: type[Any], raw: Any, what: str) -> Any:
        """``raw`` validated as ``model``, or ``None`` (rejected, logged) if malformed."""
        try:
            parsed: BaseModel = model.model_validate(raw)
            return parsed
        except ValidationError as exc:
            self._reject(f"{what}: {front_door.why_invalid(exc)}")
            return None
