"""Metric 5: what a heartbeat costs in workflow history, and the longest run seen.

5a: the current run of a steady worker's liveness is fetched after many beats; for every
``heartbeat`` signal event, the events until the next one (signal, workflow task, timers,
...) and the size of the signal's input payloads. Shown for a liveness-only worker of the
fleet and for a worker that sends a 100-container complete report in every beat.
5b: ``describe().history_length`` of every running ``WorkerLiveness`` and
``HandleCollector`` of the run, and the number of runs (continue-as-new) from
``count_workflows``. Ceilings from issue 4: no payload above 256 KiB, no run above 10,000
events.
"""

from __future__ import annotations

import itertools
import statistics

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench.anatomy import secs
from bench.common import fmt_bytes, gather_limited
from bench.result import Metric, verdict
from workflows.common import liveness_id

PAYLOAD_CEILING = 256 * 1024
RUN_CEILING = 10_000


async def per_beat(client: Client, worker: str) -> dict:
    handle = client.get_workflow_handle(liveness_id(worker))
    history = await handle.fetch_history()
    signal_at: list[int] = []
    sizes: list[int] = []
    events = list(history.events)
    for ev in events:
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            attrs = ev.workflow_execution_signaled_event_attributes
            if attrs.signal_name == "heartbeat":
                signal_at.append(ev.event_id)
                sizes.append(sum(p.ByteSize() for p in attrs.input.payloads))
    gaps = [b - a for a, b in itertools.pairwise(signal_at)]
    desc = await handle.describe()
    hist_bytes = desc.raw_description.workflow_execution_info.history_size_bytes
    return {
        "worker": worker,
        "beats": len(signal_at),
        "events": len(events),
        "gaps": gaps,
        "sizes": sizes,
        "bytes": hist_bytes,
    }


def _describe(stats: dict, label: str) -> str:
    g, s = stats["gaps"] or [0], stats["sizes"] or [0]
    return (
        f"{label} ({stats['worker']}, {stats['beats']} beats in a run of "
        f"{stats['events']} events, {fmt_bytes(stats['bytes'])}): events per beat median "
        f"{statistics.median(g):g}, max {max(g)}; signal payload median "
        f"{fmt_bytes(statistics.median(s))}, max {fmt_bytes(max(s))}; "
        f"{fmt_bytes(stats['bytes'] / max(stats['events'], 1) * statistics.median(g))} "
        "of history per beat"
    )


async def per_heartbeat(client: Client, quiet: str, reporting: str) -> Metric:
    q = await per_beat(client, quiet)
    r = await per_beat(client, reporting)
    gq, sq = q["gaps"] or [0], q["sizes"] or [0]
    biggest = max(max(q["sizes"] or [0]), max(r["sizes"] or [0]))
    return Metric(
        "5a",
        f"{statistics.median(gq):g} events (max {max(gq)}), "
        f"{fmt_bytes(statistics.median(sq))} (max {fmt_bytes(max(sq))}) per liveness-only beat",
        "payload <= 256 KiB",
        verdict(biggest <= PAYLOAD_CEILING),
        [_describe(q, "liveness-only beats"), _describe(r, "100-container report every beat")],
    )


async def longest(client: Client) -> Metric:
    async def lengths(wtype: str) -> list[tuple[int, str]]:
        ids = [
            w.id
            async for w in client.list_workflows(
                f"WorkflowType = '{wtype}' AND ExecutionStatus = 'Running'"
            )
        ]

        async def one(wid: str) -> tuple[int, str]:
            d = await client.get_workflow_handle(wid).describe()
            return d.history_length, wid

        return await gather_limited((one(i) for i in ids), 64)

    live = await lengths("WorkerLiveness")
    coll = await lengths("HandleCollector")
    runs = (await client.count_workflows("WorkflowType = 'WorkerLiveness'")).count
    crun = (await client.count_workflows("WorkflowType = 'HandleCollector'")).count
    top = max(live) if live else (0, "-")
    ctop = max(coll) if coll else (0, "-")
    worst = max(top[0], ctop[0])
    return Metric(
        "5b",
        f"{top[0]:,} events ({top[1]}); {runs:,} runs of {len(live):,} liveness workflows",
        f"<= {RUN_CEILING:,} events",
        verdict(worst <= RUN_CEILING),
        [
            f"longest HandleCollector run: {ctop[0]:,} events ({ctop[1]}); {crun:,} runs of "
            f"{len(coll):,} collectors",
            "median liveness run: "
            f"{statistics.median([n for n, _ in live]) if live else 0:g} events",
        ],
    )


async def task_latencies(
    client: Client, workflow_ids: list[str], since: float, until: float = float("inf")
) -> tuple[list[float], list[float]]:
    """Workflow tasks of ``workflow_ids`` started between ``since`` and ``until`` (wall
    clock): their waits
    in the task queue (scheduled -> started) and their run times on the controller (started ->
    completed, which includes any replay of the history after a cache eviction)."""
    waits: list[float] = []
    runs: list[float] = []

    async def one(wid: str) -> None:
        history = await client.get_workflow_handle(wid).fetch_history()
        scheduled: dict[int, float] = {}
        started: dict[int, float] = {}
        for ev in history.events:
            if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                scheduled[ev.event_id] = secs(ev)
            elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                sid = ev.workflow_task_started_event_attributes.scheduled_event_id
                started[ev.event_id] = secs(ev)
                if since <= secs(ev) < until and sid in scheduled:
                    waits.append(secs(ev) - scheduled[sid])
            elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                a = ev.workflow_task_completed_event_attributes
                s = started.get(a.started_event_id)
                if s is not None and since <= s < until:
                    runs.append(secs(ev) - s)

    await gather_limited((one(w) for w in workflow_ids), 8)
    return waits, runs


def quantile(xs: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``xs`` by the nearest rank; 0 for none."""
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def spread(xs: list[float]) -> str:
    """``median a s, p95 b s, p99 c s, max d s`` of a list of durations."""
    if not xs:
        return "none"
    return (
        f"median {statistics.median(xs):.3f} s, p95 {quantile(xs, 0.95):.3f} s, "
        f"p99 {quantile(xs, 0.99):.3f} s, max {max(xs):.3f} s"
    )


_SHORT = {
    EventType.EVENT_TYPE_TIMER_FIRED: "timer fired",
    EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED: "task scheduled",
    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED: "task started",
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: "task completed",
    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: "scheduled",
    EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED: "started",
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "completed",
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "FAILED",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "TIMED OUT",
    EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED: "child initiated",
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED: "child started",
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED: "child completed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED: "workflow started",
}


async def timeline(client: Client, workflow_id: str, since: float, origin: float) -> str:
    """The events of a workflow after ``since`` as ``+seconds what`` from ``origin`` (wall
    clock), activities named: a compact account of where time went."""
    try:
        history = await client.get_workflow_handle(workflow_id).fetch_history()
    except Exception as exc:  # gone, or never started
        return f"{workflow_id}: {type(exc).__name__}"
    names: dict[int, str] = {}
    parts = []
    for ev in history.events:
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names[ev.event_id] = ev.activity_task_scheduled_event_attributes.activity_type.name
        t = secs(ev)
        if t < since or ev.event_type not in _SHORT:
            continue
        what = _SHORT[ev.event_type]
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            what = f"{names[ev.event_id]} scheduled"
        elif ev.event_type in (
            EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED,
            EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
            EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
        ):
            attrs = (
                ev.activity_task_started_event_attributes
                if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
                else ev.activity_task_completed_event_attributes
                if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
                else ev.activity_task_failed_event_attributes
            )
            what = f"{names.get(attrs.scheduled_event_id, 'activity')} {what}"
        parts.append(f"+{t - origin:.2f} {what}")
    return f"{workflow_id}: " + ", ".join(parts)


async def timer_lateness(client: Client, workflow_ids: list[str], since: float) -> list[float]:
    """For timers of ``workflow_ids`` that fired after ``since`` (wall clock): how late the
    server fired each, against its start time plus its duration (server-side lag)."""
    late: list[float] = []

    async def one(wid: str) -> None:
        history = await client.get_workflow_handle(wid).fetch_history()
        due: dict[int, float] = {}
        for ev in history.events:
            if ev.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
                d = ev.timer_started_event_attributes.start_to_fire_timeout
                due[ev.event_id] = secs(ev) + d.seconds + d.nanos / 1e9
            elif ev.event_type == EventType.EVENT_TYPE_TIMER_FIRED and secs(ev) >= since:
                sid = ev.timer_fired_event_attributes.started_event_id
                if sid in due:
                    late.append(secs(ev) - due[sid])

    await gather_limited((one(w) for w in workflow_ids), 8)
    return late
