"""What a replay says about a stuck liveness: does its history replay on the controller's code,
and if not, where may it be reset (``reaper.core.policy.repair.latest_replayable``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from temporalio import workflow
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import Client, WorkflowHistory

from reaper.core.policy import repair as policy

ReplayCheck = Callable[[WorkflowHistory], Awaitable[BaseException | None]]
"""Replays a history on the controller's workflow code: ``None`` if it replays cleanly, else
the failure (``temporalio.workflow.NondeterminismError`` for a nondeterminism)."""


TAIL_EVENTS = 100
"""Events read from the end of a history to count its failed workflow tasks in a row."""
_OUTCOMES = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: "completed",
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED: "failed",
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT: "timed-out",
}


async def recent_task_outcomes(client: Client, workflow_id: str, run_id: str) -> list[str]:
    """The outcomes of the workflow tasks among the last :data:`TAIL_EVENTS` events of a
    run's history, newest first (``"completed"``, ``"failed"``, ``"timed-out"``), for
    ``policy.repair.failures_in_a_row``: one page read from the end, not the whole history.

    Raises:
        temporalio.service.RPCError: Temporal did not answer.
    """
    page = await client.workflow_service.get_workflow_execution_history_reverse(
        GetWorkflowExecutionHistoryReverseRequest(
            namespace=client.namespace,
            execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
            maximum_page_size=TAIL_EVENTS,
        )
    )
    return [_OUTCOMES[e.event_type] for e in page.history.events if e.event_type in _OUTCOMES]


def completed_tasks(history: WorkflowHistory) -> list[int]:
    """Ids of the ``WorkflowTaskCompleted`` events of ``history``, ascending."""
    done = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    return [e.event_id for e in history.events if e.event_type == done]


def prefix(history: WorkflowHistory, last_event_id: int) -> WorkflowHistory:
    """``history`` up to and including event ``last_event_id``."""
    return WorkflowHistory(
        history.workflow_id, [e for e in history.events if e.event_id <= last_event_id]
    )


@dataclass(frozen=True)
class Diagnosis:
    """What a replay of a liveness's history says about repairing it."""

    failure: BaseException | None
    """The whole history's replay failure; ``None`` if it replays (nothing to repair)."""
    point: int | None = None
    """Where to reset: the latest ``WorkflowTaskCompleted`` event whose prefix replays, if the
    failure is a nondeterminism and such an event exists; else ``None`` (do not reset)."""

    @property
    def nondeterministic(self) -> bool:
        return isinstance(self.failure, workflow.NondeterminismError)


async def diagnose(history: WorkflowHistory, replay: ReplayCheck) -> Diagnosis:
    """Replay ``history``; if it fails with a nondeterminism, find the reset point
    (``policy.repair.latest_replayable``, a few more replays of prefixes).

    Raises:
        Whatever ``replay`` raises (it reports replay failures as values).
    """
    failure = await replay(history)
    if not isinstance(failure, workflow.NondeterminismError):
        return Diagnosis(failure)

    async def replays(event_id: int) -> bool:
        return await replay(prefix(history, event_id)) is None

    point = await policy.latest_replayable(
        completed_tasks(history), replays, policy.rejected_event_id(str(failure))
    )
    return Diagnosis(failure, point)
