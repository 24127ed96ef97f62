"""What the controller lends its workflows from outside them: the seal of a forwarded report
(``activities.sealing``, keyed by the controller's secret) and the counters of rejected and
ignored input (``activities.metrics``). The controller passes them in as the SDK's extern
functions (``worker.ControllerHooks``); workflow code asks for them here by name and never
imports the process's I/O modules.

None of them shapes a decision: a seal is part of a signal's payload, a count is a metric.
A worker that lends nothing (the SDK's ``Replayer``, a test's bare worker) seals with
``""`` (a collector then refuses the report: nothing is marked on an unsealed one) and
counts nothing. Counts are made only outside replay, so a replay never counts twice.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

SEAL = "reaper_seal"
"""``(worker, kind, report) -> str``: the report's seal (``activities.sealing.seal``)."""
COUNT_REJECTED = "reaper_count_rejected"
"""``() -> None``: one more rejected heartbeat or operator command (§5.4)."""
COUNT_IGNORED = "reaper_count_ignored"
"""``(workflow_type, why) -> None``: one more input ignored (``workflows.front_door``)."""


def _lent(name: str) -> Any:
    return workflow.extern_functions().get(name)


def seal(worker: str, kind: str, report: Any) -> str:
    """The seal of a report the liveness forwards to its collector, or ``""`` where the
    controller lent none."""
    fn = _lent(SEAL)
    return str(fn(worker, kind, report)) if fn is not None else ""


def count_rejected() -> None:
    """Count a rejected input once (never on replay)."""
    fn = _lent(COUNT_REJECTED)
    if fn is not None and not workflow.unsafe.is_replaying():
        fn()


def count_ignored(workflow_type: str, why: str) -> None:
    """Count an ignored input once (never on replay)."""
    fn = _lent(COUNT_IGNORED)
    if fn is not None and not workflow.unsafe.is_replaying():
        fn(workflow_type, why)
