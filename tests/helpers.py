"""Helpers for tests: building beats, signal-with-start, polling with a deadline."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, TypeVar

from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from reaper.core.contract import StateView

from reaper.core.models import LivenessInput
from workflows import WorkerLiveness
from workflows.common import liveness_id

T = TypeVar("T")


def beat(worker: str, seq: int, boot_id: str = "boot-1", **reports: Any) -> dict[str, Any]:
    """A heartbeat payload (CONTRACT.md §2) with optional ``containers=[...]`` etc."""
    payload: dict[str, Any] = {"worker": worker, "boot_id": boot_id, "seq": seq,
                               "sent_at": "2026-11-30T10:00:00Z"}
    payload.update(reports)
    return payload


async def send(client: Client, task_queue: str, payload: dict[str, Any],
               worker: str | None = None) -> WorkflowHandle:
    """Signal-with-start a heartbeat, as an agent does."""
    name = worker or payload["worker"]
    return await client.start_workflow(
        WorkerLiveness.run, LivenessInput(worker=name), id=liveness_id(name),
        task_queue=task_queue, start_signal="heartbeat", start_signal_args=[payload],
    )


async def query_state(client: Client, worker: str) -> StateView:
    return await client.get_workflow_handle(liveness_id(worker)).query(
        WorkerLiveness.state, result_type=StateView
    )


async def eventually(fn: Callable[[], Awaitable[T]], check: Callable[[T], bool],
                     timeout: float = 20.0, what: str = "condition", poll: float = 0.05) -> T:
    """Poll ``fn`` until ``check`` holds, or fail after ``timeout`` real seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        try:
            last = await fn()
        except RPCError as exc:
            # The time-skipping test server now and then lets a query time out while it
            # moves time; ask again (a real failure still ends at the deadline).
            if "deadline" not in str(exc).lower() and "timeout" not in str(exc).lower():
                raise
            await asyncio.sleep(poll)
            continue
        if check(last):
            return last
        await asyncio.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}; last value: {last!r}")
