"""Failed workflow tasks: every run on the campaign's task queue (liveness, collector, reap,
fleet monitor; continued-as-new runs included) read back from Temporal.

A ``WorkflowTaskFailed`` event is a workflow that raised, could not be replayed
(non-determinism) or sent a bad command: a bug, and a workflow stuck retrying its task. Two
causes are the server's, not the workflow's, and are counted apart:
``UNHANDLED_COMMAND`` (a signal arrived while the task was completing the run, e.g. at
continue-as-new: the server discards the completion and hands the workflow a new task with
the signal, nothing lost) and ``RESET_STICKY_TASK_QUEUE`` (the sticky worker was gone).
A run that ended ``FAILED``, ``TERMINATED`` or ``TIMED_OUT`` is a failure too.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

SERVER_CAUSES = {
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND,
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_STICKY_TASK_QUEUE,
}
BAD_ENDS = {
    WorkflowExecutionStatus.FAILED,
    WorkflowExecutionStatus.TERMINATED,
    WorkflowExecutionStatus.TIMED_OUT,
}
PARALLEL = 8
"""Histories fetched at once."""
ATTEMPTS = 6
"""Tries of one call (0.5 s, 1 s, 2 s, ... apart)."""


@dataclass
class Scan:
    """What the histories hold."""

    runs: int = 0
    failures: list[str] = field(default_factory=list)
    """One line per failed workflow task (or failed run): workflow id, cause, message."""
    server_causes: Counter[str] = field(default_factory=Counter)
    failed: dict[tuple[str, str], str] = field(default_factory=dict)
    """``(workflow id, run id)`` -> its history as JSON, for each run with a failure (kept
    with ``--keep``, for a replay with the SDK's ``Replayer``)."""


async def scan(client: Client, task_queue: str) -> Scan:
    """Read every run on ``task_queue`` and collect its failed workflow tasks."""
    out = Scan()
    gate = asyncio.Semaphore(PARALLEL)

    async def one(wf_id: str, run_id: str, status: WorkflowExecutionStatus | None) -> None:
        async with gate:
            handle = client.get_workflow_handle(wf_id, run_id=run_id)
            history = await _patiently(handle.fetch_history)
        out.runs += 1
        before = len(out.failures)
        if status in BAD_ENDS:
            out.failures.append(f"{wf_id} run {run_id[:8]}: ended {status.name}")
        for e in history.events:
            if e.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                continue
            a = e.workflow_task_failed_event_attributes
            cause = WorkflowTaskFailedCause.Name(a.cause).removeprefix(
                "WORKFLOW_TASK_FAILED_CAUSE_"
            )
            if a.cause in SERVER_CAUSES:
                out.server_causes[cause] += 1
            else:
                msg = a.failure.message.splitlines()[0] if a.failure.message else ""
                out.failures.append(f"{wf_id} run {run_id[:8]} event {e.event_id}: {cause}: {msg}")
        if len(out.failures) > before:
            out.failed[(wf_id, run_id)] = history.to_json()

    async def listing() -> list[tuple[str, str, WorkflowExecutionStatus | None]]:
        return [
            (wf.id, wf.run_id, wf.status)
            async for wf in client.list_workflows(f"TaskQueue = '{task_queue}'")
        ]

    await asyncio.gather(*(one(*run) for run in await _patiently(listing)))
    return out


T = TypeVar("T")


async def _patiently(call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, tried again on an RPC error: the campaign's client gives up on a call
    within a second (its agents' loops are their retry), a loaded server may take longer."""
    for attempt in range(ATTEMPTS - 1):
        try:
            return await call()
        except RPCError:
            await asyncio.sleep(0.5 * 2**attempt)
    return await call()
