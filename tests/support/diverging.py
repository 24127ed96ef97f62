"""A ``WorkerLiveness`` that decides differently from reaper's: histories it writes cannot be
replayed by reaper's code, as the chaos campaign's stuck liveness could not (docs/chaos.md, "What
the campaigns found"). Registered under reaper's workflow type name on a controller of a
test's own; when that controller stops and a real one takes over, every workflow task of
such a run fails with a nondeterminism error, for ever: a stuck liveness, made on purpose.

It runs reaper's liveness unchanged plus one timer reaper's code never starts, at a point
that depends on the worker's name: ``early-*`` at the start of every run (before anything
else is decided, so the last replayable point precedes the collector's start), ``late-*``
once a beat with ``seq`` >= :data:`LATE_SEQ` was accepted. Any other worker's liveness is
reaper's, decision for decision.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

with workflow.unsafe.imports_passed_through():
    from workflows.liveness import WorkerLiveness

EARLY = "early-"
"""Name prefix of workers whose liveness diverges in its first workflow task."""
LATE = "late-"
"""Name prefix of workers whose liveness diverges once it has accepted :data:`LATE_SEQ`."""
LATE_SEQ = 3
EXTRA_TIMER_S = 3_600
"""The timer reaper's code never starts (long: it never fires within a test)."""


@workflow.defn(name="WorkerLiveness")
class DivergingLiveness(WorkerLiveness):
    """Reaper's liveness plus one timer of its own (see the module docstring)."""

    @workflow.run
    async def run(self, *args: Any) -> None:
        worker = self.live.worker
        if not worker.startswith((EARLY, LATE)):
            await super().run(*args)
            return

        async def extra() -> None:
            if worker.startswith(LATE):
                await workflow.wait_condition(lambda: self.live.last_seq >= LATE_SEQ)
            await workflow.sleep(EXTRA_TIMER_S, summary="not reaper's")

        diverge = asyncio.ensure_future(extra())
        try:
            await super().run(*args)
        finally:
            diverge.cancel()


async def events_of(client: Client, workflow_id: str, run_id: str | None = None) -> list[Any]:
    """The history events of a workflow's run (the latest if ``run_id`` is None); none if it
    has not started."""
    try:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        return list((await handle.fetch_history()).events)
    except Exception:  # not started yet
        return []


def diverged(events: list[Any]) -> bool:
    """The diverging liveness started its own timer in this run."""
    return any(
        e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
        and e.timer_started_event_attributes.start_to_fire_timeout.seconds == EXTRA_TIMER_S
        for e in events
    )
