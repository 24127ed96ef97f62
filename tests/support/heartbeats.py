"""Heartbeats as an agent sends them (CONTRACT.md §2), and the `state` query it reads back:
the kit's (:mod:`reaper.kit.agents`), with payloads and waits for tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client
from temporalio.service import RPCError

from reaper.core.contract import StateView
from reaper.kit.agents import query_state, send_heartbeat
from tests.support.polling import Changes, eventually
from tests.support.scheduler import setup_service
from workflows.common import collector_id


def beat(worker: str, seq: int, boot_id: str = "boot-1", **reports: Any) -> dict[str, Any]:
    """A heartbeat payload (CONTRACT.md §2) with optional ``containers=[...]`` etc."""
    payload: dict[str, Any] = {
        "worker": worker,
        "boot_id": boot_id,
        "seq": seq,
        "sent_at": "2026-11-30T10:00:00Z",
    }
    payload.update(reports)
    return payload


send = send_heartbeat
"""Signal-with-start a heartbeat, as an agent does (:func:`reaper.kit.agents.send_heartbeat`):
``send(client, task_queue, payload, worker=None)``."""


async def current_details(client: Client, workflow_id: str) -> str:
    """A workflow's current details, as the Web UI reads them (the SDK's built-in
    ``__temporal_workflow_metadata`` query)."""
    meta = await client.get_workflow_handle(workflow_id).query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    return meta.current_details


async def beats_handled(client: Client, worker: str, n: int, timeout: float = 60.0) -> StateView:
    """Wait until ``worker``'s liveness has handled ``n`` more beats than it had now (the
    `state` query's ``last_seq``; same boot) and its collector has reconciled every report
    forwarded meanwhile (`processed`). Use it where a test would otherwise sleep and then
    assert that nothing else happened: this waits for the controller to have had its chance."""
    start = await eventually(
        lambda: query_state(client, worker),
        lambda s: s.last_seq is not None,
        timeout=timeout,
        what=f"a beat of {worker} handled",
    )
    assert start.last_seq is not None
    want = start.last_seq + n
    await eventually(
        lambda: query_state(client, worker),
        lambda s: s.boot_id != start.boot_id or (s.last_seq is not None and s.last_seq >= want),
        timeout=timeout,
        poll=0.1,
        what=f"{n} more beats of {worker} handled",
    )
    return await reports_reconciled(client, worker, timeout=timeout)


async def reports_reconciled(
    client: Client,
    worker: str,
    timeout: float = 20.0,
    *,
    handled: Callable[[StateView], bool] = lambda _: True,
    first: float | None = None,
    changes: Changes | None = None,
) -> StateView:
    """Wait until every report ``worker``'s liveness forwarded has been reconciled by its
    collector (`processed` equals the liveness's ``forwarded_reports``, `backlog` empty) in
    a `state` for which ``handled`` holds too (e.g. a given beat's ``last_seq``: one poll
    for both waits). ``first``, ``changes``: :func:`tests.support.polling.eventually`'s."""

    async def snapshot() -> tuple[StateView, int, int]:
        st = await query_state(client, worker)
        processed, backlog = 0, 0
        if not handled(st):
            processed = -1  # not yet: no need to ask the collector
        elif st.forwarded_reports:
            try:
                # Both read after the `state` above: `processed` only grows and never
                # passes what was forwarded, so equal to it means reconciled at that moment.
                h = client.get_workflow_handle(collector_id(worker))
                processed, backlog = await asyncio.gather(
                    h.query("processed", result_type=int), h.query("backlog", result_type=int)
                )
            except RPCError:
                processed = -1
        return st, processed, backlog

    st, _, _ = await eventually(
        snapshot,
        lambda t: (
            handled(t[0])
            and t[0].pending_reports == 0
            and t[1] == t[0].forwarded_reports
            and t[2] == 0
        ),
        timeout=timeout,
        what=f"reports of {worker} reconciled",
        first=first,
        changes=changes,
    )
    return st


BENIGN = {
    # The server refused a completion because a signal came in meanwhile; it hands the task
    # out again with the signal. Temporal's ordinary flow, not a fault of the workflow.
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND,
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_STICKY_TASK_QUEUE,
    # The server failed a task in flight to write the events buffered behind it: more than
    # 100 of them, or more than 2 MB (history.maximumBufferedEventsBatch and
    # maximumBufferedEventsSizeInBytes; Temporal's own MaxBufferedEventSuite). It hands the
    # task out again with those events; its local activities run again (they are
    # idempotent). Also the cause of the task failed when a run is terminated or times out.
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_FORCE_CLOSE_COMMAND,
}


async def failed_tasks(client: Client, workflow_id: str, keep: Path | None = None) -> list[str]:
    """The failure messages of the workflow's failed workflow tasks (nondeterminism, an
    exception in workflow code, a payload over the limit), over all its runs; the server's
    own refusals (:data:`BENIGN`) left out. With ``keep`` (a directory), the history of each
    run with such a failure is written there as JSON and its path is the first message."""
    failures = []
    async for wf in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        history = await client.get_workflow_handle(workflow_id, run_id=wf.run_id).fetch_history()
        found = [
            e.workflow_task_failed_event_attributes.failure.message
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
            and e.workflow_task_failed_event_attributes.cause not in BENIGN
        ]
        if found and keep is not None:
            kept = keep / f"{workflow_id}-{wf.run_id}.json"
            kept.write_text(history.to_json())
            found.insert(0, f"history of run {wf.run_id} kept in {kept}")
        failures += found
    return failures


async def register_with_task(
    client: Client, pool: asyncpg.Pool, task_queue: str, worker: str, service: str
) -> str:
    """Register ``worker`` (two beats) holding the one task of ``service``, and wait until
    that task is ``running``; returns the task's id (``t-{worker}``)."""
    task = f"t-{worker}"
    await setup_service(pool, service, {worker: [task]})
    for seq in (1, 2):
        await send(client, task_queue, beat(worker, seq, tasks=[task]))
    await eventually(
        lambda: pool.fetchval("SELECT state FROM reaper.tasks WHERE id = $1", task),
        lambda s: s == "running",
        timeout=30,
        what="the task running",
    )
    return task
