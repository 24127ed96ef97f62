"""The liveness's operator commands: ``force_reap``, ``drain``, ``undrain`` and ``retire``, as
signals (CONTRACT.md §2, §5.1) and, in ``rotating-hosts`` runs, as Temporal Updates that
answer (§6.3).

A signal is taken as it arrives: parsed, authenticated (``workflows.gate``, §5.2) and handed
to ``liveness_machine.decide``; what does not parse or may not act is logged and counted,
never raised. An update is first asked of :meth:`OperatorCommands.refusal`, its validator,
which reads only: a refused update leaves no event in the workflow's history, and the
caller gets the one-line reason. An accepted one is applied as the signal is, then answered
once the loop has carried it out (the drain's row written, the loss recorded, the worker
retired), with what changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from reaper.core.contract import DrainInput, ReasonInput, WorkerState
    from reaper.core.liveness_state import DrainRequest, LivenessState
    from reaper.core.policy import liveness_machine as machine
    from reaper.core.policy import migration, rollout
    from reaper.core.policy.fleet import retire_is_stale
    from workflows import front_door, hooks
    from workflows.gate import Gate

COMMANDS = ("force_reap", "drain", "undrain", "retire")
STARTING = "the liveness is starting a run: try again in a moment"
"""An update's refusal while a run reads its settings (a continue-as-new, about every
4,000 events): the caller asks again (``reaper`` does, for a few seconds)."""
"""The operator commands, as signals and as updates (CONTRACT.md §6.3)."""


class OperatorCommands:
    """Takes operator commands for one liveness.

    Args:
        live: the liveness's state.
        gate: who may speak for the worker (§5.2).
        reject: logs and counts a rejected input (the liveness's ``_reject``).
    """

    def __init__(self, live: LivenessState, gate: Gate, reject: Callable[[str], None]) -> None:
        self.live = live
        self.gate = gate
        self.reject = reject

    # ---- signals ---------------------------------------------------------------------------

    def signal(self, what: str, raw: Any) -> None:
        """Take signal ``what`` (one of :data:`COMMANDS`) with its first argument ``raw``."""
        if self.later(what, raw):
            return
        req = self._parse(what, raw)
        if req is None:
            return
        refused = self.gate.operator(what, raw)
        if refused is not None:
            self.reject(refused)
            return
        if isinstance(req, DrainInput):
            refused = self._drain_refusal(req)
            if refused is not None:
                self.reject(f"drain: {refused}")
                return
        elif what == "drain" and isinstance(raw, dict) and raw.get("migrate") is True:
            # What a 1.1 controller does with this history: a plain drain (rollout.py).
            workflow.logger.warning(
                "drain of %s applied without migrating: a migrating drain needs every"
                " controller on 1.2 (REAPER_PEER_VERSION=1.2)",
                self.live.worker,
            )
        self._apply(what, req)

    def later(self, what: str, raw: Any) -> bool:
        """Keep ``raw`` of ``what`` if the run's settings are not loaded yet (True if kept):
        who may speak depends on them, so it is taken, in order, once they are."""
        if self.live.early is None:
            return False
        self.live.early.append((what, raw))
        return True

    def _parse(self, what: str, raw: Any) -> ReasonInput | None:
        """``raw`` as the command's input, or ``None`` (rejected, logged) if malformed."""
        model = self._model(what)
        try:
            return model.model_validate(raw if raw is not None else {})
        except ValidationError as exc:
            self.reject(f"{what}: {front_door.why_invalid(exc)}")
            return None

    def _model(self, what: str) -> type[ReasonInput]:
        """A ``drain``'s input is ``DrainInput`` in ``rotating-hosts`` runs; every other
        command's, and a 1.1 run's drain, ``ReasonInput`` (migrate ignored, as 1.1 did)."""
        return (
            DrainInput
            if what == "drain" and self.live.features.uses(rollout.ROTATING_HOSTS)
            else ReasonInput
        )

    def _drain_refusal(self, req: DrainInput) -> str | None:
        t = self.live.timings
        return migration.deadline_refused(req.deadline, t.heartbeat_interval if t else 0.0)

    def _apply(self, what: str, req: ReasonInput) -> str | None:
        """Hand the command to ``liveness_machine.decide``; returns the drain request's key
        for a drain or undrain (``None`` otherwise)."""
        live, now = self.live, workflow.now()
        if what == "force_reap":
            out = machine.decide(live, now, machine.ForceReap(req)).outcome
            if out.verdict == "rejected":
                self.reject(out.reason or what)
            return None
        if what == "retire":
            out = machine.decide(live, now, machine.Retire(req)).outcome
            if out.reason is not None:
                workflow.logger.info("%s: %s", live.worker, out.reason)
            return None
        asked = DrainRequest(
            draining=what == "drain",
            reason=req.reason,
            actor=req.actor,
            migrate=isinstance(req, DrainInput) and req.migrate,
            deadline=req.deadline if isinstance(req, DrainInput) else None,
        )
        info = workflow.info()
        drain = machine.Drain(asked, run=f"{info.workflow_id}:{info.run_id}")
        out = machine.decide(live, now, drain).outcome
        if out.reason is not None:
            workflow.logger.info("%s: %s", live.worker, out.reason)
        return f"drain:{drain.run}:{live.drains_taken}"

    # ---- updates (CONTRACT.md §6.3) --------------------------------------------------------

    def refusal(self, what: str, raw: Any) -> str:
        """An update's validator: the one-line reason ``what`` with ``raw`` is refused, or
        ``""`` if it may be taken. Reads only (Temporal runs validators outside history)."""
        live = self.live
        if live.early is not None:  # its features are decided once its settings are read
            return STARTING
        if not live.features.uses(rollout.ROTATING_HOSTS):
            return (
                f"{what} as an update needs every controller on 1.2 (REAPER_PEER_VERSION=1.2);"
                " send the signal"
            )
        try:
            req = self._model(what).model_validate(raw if raw is not None else {})
        except ValidationError as exc:
            return f"{what}: {front_door.why_invalid(exc)}"
        refused, _ = self.gate.operator_refusal(what, raw)
        if refused is not None:
            return refused
        if live.last_heartbeat_at is None:
            return f"unknown worker {live.worker}: it never sent a valid heartbeat"
        if live.state is WorkerState.retired:
            return f"{live.worker} is retired"
        if isinstance(req, DrainInput):
            return self._drain_refusal(req) or ""
        if what == "retire" and retire_is_stale(req.boot_id, live.boot_id):
            return f"retire of boot {req.boot_id}: {live.worker} runs another boot"
        return ""

    async def answer(self, what: str, raw: Any) -> dict[str, Any]:
        """An accepted update: apply ``what`` as its signal is applied, wait until the loop
        has carried it out, and say what changed (a JSON object with ``accepted: true``)."""
        live = self.live
        req = self._model(what).model_validate(raw if raw is not None else {})
        refused = self.gate.operator(what, raw)  # remembers the signature (§5.2)
        if refused is not None:  # the validator said yes a moment ago: a replayed signature
            return {"accepted": False, "reason": refused}
        before = live.state.value
        key = self._apply(what, req)
        out: dict[str, Any] = {"accepted": True, "command": what, "worker": live.worker}
        if key is not None:
            await workflow.wait_condition(lambda: key in live.drain_answers)
            out |= {"changed": live.drain_answers[key], "draining": live.draining}
            out |= self.drain_view(workflow.now())
        elif what == "force_reap":
            await workflow.wait_condition(
                lambda: (
                    (live.recorded_state is WorkerState.lost and live.recorded_forced)
                    or live.reap_request is None
                )
            )
            out |= {"changed": before != "lost", "state": live.state.value, "was": before}
        else:
            await workflow.wait_condition(
                lambda: live.state is WorkerState.retired or live.retire_request is None
            )
            changed = live.state is WorkerState.retired and before != "retired"
            out |= {"changed": changed, "state": live.state.value, "was": before}
        return out

    def drain_view(self, now: datetime) -> dict[str, Any]:
        """The drain as an answer shows it: whether a migration runs and its deadline, and
        whether the worker is drained (§6.2)."""
        live = self.live
        until = live.migrate_until if live.migrate_until and live.migrate_until > now else None
        return {
            "migrating": until is not None,
            "deadline": until.isoformat() if until else None,
            "drained": live.draining and live.drained_at is not None,
        }


class OperatorHandlers:
    """The liveness's operator handlers (CONTRACT.md §2, §5.1, §6.3): the signals and the
    updates of :data:`COMMANDS`, and the refusal of any other update. Mixed into
    ``WorkerLiveness``, which sets ``self.ops``; every handler takes any arguments
    (``workflows.front_door``)."""

    ops: OperatorCommands

    @workflow.signal(name="force_reap")
    def force_reap(self, *args: Any) -> None:
        """Operator: reap this worker now (bypasses the disruption guard, rule 5)."""
        self.ops.signal("force_reap", front_door.first(args, "force_reap"))

    @workflow.signal(name="drain")
    def drain(self, *args: Any) -> None:
        """Operator: place nothing new on this worker; with ``migrate``, move its tasks
        (§5.1, §6.1)."""
        self.ops.signal("drain", front_door.first(args, "drain"))

    @workflow.signal(name="undrain")
    def undrain(self, *args: Any) -> None:
        """Operator: placements on this worker resume, a migration ends (§5.1, §6.1)."""
        self.ops.signal("undrain", front_door.first(args, "undrain"))

    @workflow.signal(name="retire")
    def retire(self, *args: Any) -> None:
        """Operator or agent: the worker leaves the fleet for good (§5.1), at once."""
        self.ops.signal("retire", front_door.first(args, "retire"))

    # ---- the same commands as updates that answer (CONTRACT.md §6.3) -----------------------

    @workflow.update(name="force_reap")
    async def force_reap_update(self, *args: Any) -> dict[str, Any]:
        """``force_reap`` that answers once the loss is recorded."""
        return await self.ops.answer("force_reap", front_door.first(args, "force_reap"))

    @force_reap_update.validator
    def _validate_force_reap(self, *args: Any) -> None:
        self._validate("force_reap", args)

    @workflow.update(name="drain")
    async def drain_update(self, *args: Any) -> dict[str, Any]:
        """``drain`` that answers once applied: what changed, the migration, drained."""
        return await self.ops.answer("drain", front_door.first(args, "drain"))

    @drain_update.validator
    def _validate_drain(self, *args: Any) -> None:
        self._validate("drain", args)

    @workflow.update(name="undrain")
    async def undrain_update(self, *args: Any) -> dict[str, Any]:
        """``undrain`` that answers once applied."""
        return await self.ops.answer("undrain", front_door.first(args, "undrain"))

    @undrain_update.validator
    def _validate_undrain(self, *args: Any) -> None:
        self._validate("undrain", args)

    @workflow.update(name="retire")
    async def retire_update(self, *args: Any) -> dict[str, Any]:
        """``retire`` that answers once the worker is retired."""
        return await self.ops.answer("retire", front_door.first(args, "retire"))

    @retire_update.validator
    def _validate_retire(self, *args: Any) -> None:
        self._validate("retire", args)

    @workflow.update(dynamic=True)
    async def unknown_update(self, name: str, args: Sequence[RawValue]) -> None:
        """An update of a name this liveness does not know: its validator refuses it."""

    @unknown_update.validator
    def _validate_unknown(self, name: str, args: Sequence[RawValue]) -> None:
        front_door.unknown_signal(name, len(args))
        raise ValueError(f"unknown update {str(name)[:64]!r}")

    def _validate(self, what: str, args: Sequence[Any]) -> None:
        """Refuse an update (no history event; the caller gets the reason, §6.3)."""
        refused = self.ops.refusal(what, args[0] if args else None)
        if refused:
            if refused != STARTING:  # counted as a rejected signal is (§5.4)
                hooks.count_rejected()
            raise ValueError(refused)
