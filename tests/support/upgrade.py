"""What the upgrade test (tests/e2e/test_upgrade.py) reads and prints: a timeline of its
phases and of the effects the controllers wrote (``reaper.events``), the services' active
task counts as they went, and the histories of every workflow on a task queue (who ran
their tasks, what they contain, whether they replay on the code under test)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import asyncpg
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.support.heartbeats import BENIGN
from workflows import ALL_WORKFLOWS


@dataclass
class Timeline:
    """Seconds since ``t0`` (wall clock, as Postgres' ``now()`` and Temporal's event times
    are): the test's phases and the effects it observed, printed in order."""

    t0: float = field(default_factory=time.time)
    rows: list[tuple[float, str, str]] = field(default_factory=list)

    def at(self, when: datetime | float | None = None) -> float:
        """``when`` (a timestamp, an epoch, or now) in seconds since ``t0``."""
        if when is None:
            when = time.time()
        if isinstance(when, datetime):
            when = when.timestamp()
        return when - self.t0

    def phase(self, text: str) -> float:
        """Record a phase of the test now; returns its time."""
        t = self.at()
        self.rows.append((t, "phase", text))
        print(f"{t:7.1f} s  phase   {text}", flush=True)
        return t

    def effect(self, when: datetime, text: str, seen: float | None = None) -> None:
        """An effect stamped ``when``; ``seen``: when the test saw it, if much later (an
        ``events`` row carries its transaction's start, which may have waited on a lock)."""
        late = seen is not None and seen - self.at(when) > 1.0
        self.rows.append(
            (self.at(when), "effect", f"{text} (seen at {seen:.1f} s)" if late else text)
        )

    def render(self) -> str:
        return "\n".join(f"{t:7.1f} s  {k:<7} {text}" for t, k, text in sorted(self.rows))


@dataclass
class Event:
    """One ``reaper.events`` row."""

    id: int
    at: datetime
    worker: str | None
    kind: str
    handle: str | None
    action: str
    reason: str | None
    seen: float = 0.0
    """When the test first saw the row (timeline seconds): after its commit."""


class Observer:
    """Polls ``reaper.events`` and the services' active task counts every ``poll`` seconds
    while in its ``running()`` block; every event becomes a line of the timeline."""

    def __init__(self, pool: asyncpg.Pool, timeline: Timeline, poll: float = 0.2) -> None:
        self.pool, self.timeline, self.poll_s = pool, timeline, poll
        self.events: list[Event] = []
        """In the order they were seen."""
        self._ids: set[int] = set()
        self.max_active: dict[str, int] = {}
        self.desired: dict[str, int] = {}

    async def poll(self) -> None:
        # Every row, not those above the last id seen: ids are drawn when a row is written,
        # and transactions commit in another order (a lower id may show up later).
        rows = await self.pool.fetch(
            "SELECT id, at, worker, kind, handle, action, reason FROM reaper.events ORDER BY id"
        )
        seen = self.timeline.at()
        for r in rows:
            if r["id"] in self._ids:
                continue
            self._ids.add(r["id"])
            e = Event(**dict(r), seen=seen)
            self.events.append(e)
            what = f"{e.action} {e.kind} {e.handle or ''}".rstrip()
            text = f"{what} [{e.worker or 'fleet'}] {e.reason or ''}".rstrip()
            self.timeline.effect(e.at, text, seen)
        for r in await self.pool.fetch(
            "SELECT s.name, s.desired_count, count(t.id) FILTER"
            " (WHERE t.state IN ('pending', 'running')) AS active"
            " FROM reaper.services s LEFT JOIN reaper.tasks t ON t.service = s.name"
            " GROUP BY s.name, s.desired_count"
        ):
            self.desired[r["name"]] = r["desired_count"]
            self.max_active[r["name"]] = max(self.max_active.get(r["name"], 0), r["active"])

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Observer]:
        async def loop() -> None:
            while True:
                with contextlib.suppress(asyncpg.PostgresError, OSError):
                    await self.poll()
                await asyncio.sleep(self.poll_s)

        task = asyncio.get_running_loop().create_task(loop())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await self.poll()

    def of(self, action: str, handle: str | None = None, kind: str | None = None) -> list[Event]:
        return [
            e
            for e in self.events
            if e.action == action
            and (handle is None or e.handle == handle)
            and (kind is None or e.kind == kind)
        ]


# ---- histories ---------------------------------------------------------------------------


async def histories(client: Client, task_queue: str) -> list[WorkflowHistory]:
    """Every run (open or closed) of every workflow on ``task_queue``."""
    return await histories_where(client, f"TaskQueue = '{task_queue}'")


async def histories_where(client: Client, query: str) -> list[WorkflowHistory]:
    """Every run (open or closed) the visibility ``query`` lists
    (``WorkflowId = 'liveness-w'``, ``TaskQueue = 'tq'``)."""
    found = [(wf.id, wf.run_id) async for wf in client.list_workflows(query)]
    return [await client.get_workflow_handle(wid, run_id=run).fetch_history() for wid, run in found]


_STARTED = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED: ("workflow", "workflow_task_started"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED: ("activity", "activity_task_started"),
}


def task_takers(history: WorkflowHistory) -> list[tuple[datetime, str, str]]:
    """``(when, identity, "workflow"|"activity")`` of every task of the run: who took it
    (the ``pid@host`` of the controller process)."""
    took = []
    for e in history.events:
        if e.event_type in _STARTED:
            kind, attr = _STARTED[e.event_type]
            identity = getattr(e, f"{attr}_event_attributes").identity
            took.append((e.event_time.ToDatetime().astimezone(), identity, kind))
    return took


def workflow_type(history: WorkflowHistory) -> str:
    return history.events[0].workflow_execution_started_event_attributes.workflow_type.name


def _feature(e: HistoryEvent) -> str:
    name = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_")
    if e.HasField("activity_task_scheduled_event_attributes"):
        return f"{name}:{e.activity_task_scheduled_event_attributes.activity_type.name}"
    if e.HasField("workflow_execution_signaled_event_attributes"):
        return f"{name}:{e.workflow_execution_signaled_event_attributes.signal_name}"
    if e.HasField("marker_recorded_event_attributes"):
        # sdk-core's markers: a patch (its id) or a local activity (its type).
        attrs = e.marker_recorded_event_attributes
        detail = attrs.details.get("patch-data") or attrs.details.get("data")
        try:
            data = json.loads(detail.payloads[0].data) if detail else {}
        except ValueError:
            data = {}
        return f"{name}:{attrs.marker_name}:{data.get('id') or data.get('activity_type')}"
    if e.HasField("start_child_workflow_execution_initiated_event_attributes"):
        attrs = e.start_child_workflow_execution_initiated_event_attributes
        return f"{name}:{attrs.workflow_type.name}"
    if e.HasField("signal_external_workflow_execution_initiated_event_attributes"):
        attrs = e.signal_external_workflow_execution_initiated_event_attributes
        return f"{name}:{attrs.signal_name}"
    return name


def features(history: WorkflowHistory) -> set[str]:
    """What a run contains: event types, with the activity, signal, marker and child types."""
    return set(sequence(history))


def sequence(history: WorkflowHistory) -> list[str]:
    """A run's events in order, each named as :func:`features` names it."""
    return [_feature(e) for e in history.events]


def covering(runs: Iterable[WorkflowHistory], most: int = 8) -> dict[str, list[WorkflowHistory]]:
    """Per workflow type, a few runs (at most ``most``) that together contain every feature
    (:func:`features`) of its runs, the richest first (a greedy cover)."""
    by_type: dict[str, list[WorkflowHistory]] = {}
    for h in runs:
        by_type.setdefault(workflow_type(h), []).append(h)
    chosen: dict[str, list[WorkflowHistory]] = {}
    for kind, group in by_type.items():
        left = set().union(*(features(h) for h in group))
        picked: list[WorkflowHistory] = []
        while left and len(picked) < most:
            best = max(group, key=lambda h: (len(features(h) & left), -len(h.events)))
            if not features(best) & left:
                break
            picked.append(best)
            left -= features(best)
        chosen[kind] = picked
    return chosen


STORED_NAMES = {
    "WorkerLiveness": "liveness",
    "HandleCollector": "collector",
    "FleetMonitor": "fleet",
    "WorkerReap": "reap",
}


def store(runs: Iterable[WorkflowHistory], version: str, directory: Path) -> list[Path]:
    """Write the runs that cover what a release wrote (:func:`covering`) as
    ``release-{version}-{kind}.json`` (the richest), ``...-{kind}-2.json`` and so on, in
    place of any stored before for that release."""
    for old in directory.glob(f"release-{version}-*.json"):
        old.unlink()
    written = []
    for kind, picked in covering(runs).items():
        for i, h in enumerate(picked, start=1):
            tail = "" if i == 1 else f"-{i}"
            path = directory / f"release-{version}-{STORED_NAMES.get(kind, kind)}{tail}.json"
            path.write_text(h.to_json())
            written.append(path)
    return written


def failed_workflow_tasks(runs: Iterable[WorkflowHistory]) -> dict[str, list[str]]:
    """``"{workflow_id} {run_id}"`` -> the failure messages of its failed workflow tasks
    (nondeterminism, an exception in workflow code), the server's own refusals
    (``tests.support.heartbeats.BENIGN``) left out."""
    failed: dict[str, list[str]] = {}
    for h in runs:
        for e in h.events:
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                attrs = e.workflow_task_failed_event_attributes
                if attrs.cause not in BENIGN:
                    failed.setdefault(f"{h.workflow_id} {h.run_id}", []).append(
                        attrs.failure.message
                    )
    return failed


async def replay_failures(runs: list[WorkflowHistory]) -> dict[str, str]:
    """Replay ``runs`` on the code under test: ``"{workflow_id} {run_id}" -> failure`` of
    each that does not replay."""
    by_run = {h.run_id: h.workflow_id for h in runs}

    async def each() -> AsyncIterator[WorkflowHistory]:
        for h in runs:
            yield h

    replayer = Replayer(workflows=ALL_WORKFLOWS, data_converter=pydantic_data_converter)
    result = await replayer.replay_workflows(each(), raise_on_replay_failure=False)
    return {f"{by_run[run]} {run}": str(exc) for run, exc in result.replay_failures.items()}
