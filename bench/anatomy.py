"""The anatomy of a workflow's history: which events a registration or a beat writes.

Used by metrics 8a and 9 to put a reaper liveness's history beside a no-op workflow's: the
events of a registration (from the start to the second ``heartbeat`` signal) and of the
steady beats in a time window, each event named by its type and what it carries (the
activity type, the marker, the search attributes upserted, the signal).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from bench.common import gather_limited

E = EventType


def secs(ev: HistoryEvent) -> float:
    """The event's server time, seconds since the epoch."""
    return ev.event_time.seconds + ev.event_time.nanos / 1e9


def _camel(ev: HistoryEvent) -> str:
    name = EventType.Name(ev.event_type).removeprefix("EVENT_TYPE_")
    return "".join(part.capitalize() for part in name.split("_"))


def label(ev: HistoryEvent, activities: dict[int, str] | None = None) -> str:
    """``WorkflowTaskScheduled``, ``ActivityTaskScheduled(begin_liveness)``,
    ``MarkerRecorded(core_patch)``, ``MarkerRecorded(local activity record_worker_state)``,
    ``UpsertWorkflowSearchAttributes(TemporalChangeVersion)`` ..."""
    t, base = ev.event_type, _camel(ev)
    if t == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        return f"{base}({ev.activity_task_scheduled_event_attributes.activity_type.name})"
    if t in (E.EVENT_TYPE_ACTIVITY_TASK_STARTED, E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED):
        attrs = (
            ev.activity_task_started_event_attributes
            if t == E.EVENT_TYPE_ACTIVITY_TASK_STARTED
            else ev.activity_task_completed_event_attributes
        )
        name = (activities or {}).get(attrs.scheduled_event_id)
        return f"{base}({name})" if name else base
    if t == E.EVENT_TYPE_MARKER_RECORDED:
        a = ev.marker_recorded_event_attributes
        if a.marker_name == "core_local_activity" and "data" in a.details:
            raw = bytes(a.details["data"].payloads[0].data)
            kind = raw.split(b'"activity_type":"', 1)[-1].split(b'"', 1)[0].decode()
            return f"{base}(local activity {kind})"
        return f"{base}({a.marker_name})"
    if t == E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
        keys = ev.upsert_workflow_search_attributes_event_attributes.search_attributes
        return f"{base}({', '.join(sorted(keys.indexed_fields))})"
    if t == E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
        return f"{base}({ev.workflow_execution_signaled_event_attributes.signal_name})"
    return base


def is_beat(ev: HistoryEvent) -> bool:
    return (
        ev.event_type == E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and ev.workflow_execution_signaled_event_attributes.signal_name == "heartbeat"
    )


@dataclass
class Anatomy:
    """Events of some workflows, by label, and what they paid for."""

    events: Counter[str] = field(default_factory=Counter)
    count: int = 0
    beats: int = 0
    bytes: int = 0
    """Serialized size of the events (protobuf), bytes."""
    sequence: list[str] = field(default_factory=list)
    """One workflow's events in order (the first workflow looked at)."""

    def per(self, n: float) -> dict[str, float]:
        return {k: v / max(n, 1e-9) for k, v in self.events.items()}


async def _history(client: Client, workflow_id: str) -> list[HistoryEvent]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return list(history.events)


async def registration(client: Client, workflow_ids: list[str]) -> Anatomy:
    """The events of each workflow from its start up to (not including) its second
    ``heartbeat`` signal or its first timer firing: what a registration by signal-with-start
    wrote."""
    out = Anatomy()
    for i, events in enumerate(
        await gather_limited((_history(client, w) for w in workflow_ids), 8)
    ):
        acts: dict[int, str] = {}
        beats = 0
        for ev in events:
            if ev.event_type == E.EVENT_TYPE_TIMER_FIRED:
                break
            if is_beat(ev):
                beats += 1
                if beats == 2:
                    break
            if ev.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                acts[ev.event_id] = ev.activity_task_scheduled_event_attributes.activity_type.name
            name = label(ev, acts)
            out.events[name] += 1
            out.count += 1
            out.bytes += ev.ByteSize()
            if i == 0:
                out.sequence.append(name)
        out.beats += 1
    return out


async def window(client: Client, workflow_ids: list[str], start: float, end: float) -> Anatomy:
    """The events of each workflow whose server time falls in ``[start, end)`` (wall clock),
    and the ``heartbeat`` signals among them: what steady beats wrote."""
    out = Anatomy()
    for i, events in enumerate(
        await gather_limited((_history(client, w) for w in workflow_ids), 8)
    ):
        acts: dict[int, str] = {}
        for ev in events:
            if ev.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                acts[ev.event_id] = ev.activity_task_scheduled_event_attributes.activity_type.name
            if not start <= secs(ev) < end:
                continue
            name = label(ev, acts)
            out.events[name] += 1
            out.count += 1
            out.bytes += ev.ByteSize()
            out.beats += is_beat(ev)
            if i == 0:
                out.sequence.append(name)
    return out


def compact(sequence: list[str]) -> str:
    """``WorkflowTaskScheduled/Started/Completed`` runs of one workflow's events folded as
    ``WFT``, the rest joined with commas."""
    out: list[str] = []
    i = 0
    while i < len(sequence):
        if sequence[i : i + 3] == [
            "WorkflowTaskScheduled",
            "WorkflowTaskStarted",
            "WorkflowTaskCompleted",
        ]:
            out.append("WFT")
            i += 3
            continue
        out.append(sequence[i])
        i += 1
    return ", ".join(out)
