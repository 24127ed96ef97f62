"""Metric 3b: a 100,000-handle report with 1% changed, from the agent's first send until the
marks are committed in Postgres, through Temporal and the controller.

The agent's own beat builder (``reaper.protocol.build_beats``, what ``reaper agent`` sends)
splits a large changed list into chunk beats and sends unchanged lists as digests. The
worker first sends the list the database holds (the warm-up, nothing to mark), then the
changed one; the clock runs from the first send of the changed report until the 1% absent
rows carry ``missing_since``. A plain v1 beat carrying the whole list inline is tried too,
on a worker of its own, to show what Temporal does with it.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from bench.anatomy import secs
from bench.bigreport import container_ids
from bench.common import query_state, wait_settled, wait_until
from bench.env import Controller
from bench.result import Metric, verdict
from reaper.core.protocol import payload_bytes
from reaper.kit.agents import send_heartbeat

KINDS_EMPTY: dict[str, list[str]] = {"volumes": [], "tasks": []}


async def run(client: Client, ctl: Controller, size: int) -> Metric:
    from reaper.core.protocol import build_beats

    changed = size // 100
    worker = "big-e2e"
    boot = str(uuid.uuid4())
    seq = 0
    ids = container_ids(size + changed, salt="e2e")
    rows, report = ids[:size], ids[changed:]
    pool = await asyncpg.create_pool(ctl.db_url, min_size=1, max_size=2)
    details: list[str] = []
    try:

        async def send_all(beats: list[dict]) -> float:
            t = time.monotonic()
            for b in beats:  # in order, one call at a time, as the agent does
                await send_heartbeat(client, ctl.task_queue, b, worker=worker)
            return time.monotonic() - t

        # Register the worker (liveness only), then its rows appear in the database.
        await send_heartbeat(
            client, ctl.task_queue, {"worker": worker, "boot_id": boot, "seq": seq}
        )
        seq += 1
        await wait_until(lambda: _registered(pool, worker), 60, f"{worker} registered")
        await pool.copy_records_to_table(
            "containers",
            schema_name="reaper",
            columns=["handle", "worker", "state"],
            records=[(h, worker, "created") for h in rows],
        )
        await pool.execute("ANALYZE reaper.containers")

        # Warm-up: the report the database holds (nothing to mark).
        first = build_beats(worker, boot, seq, {"containers": rows, **KINDS_EMPTY}, None)
        seq += len(first)
        t0 = time.monotonic()
        await send_all(first)
        try:
            await wait_settled(client, {worker: seq - 1}, timeout=180)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}: {await _where(client, worker)}") from None
        warm = time.monotonic() - t0
        known = (await query_state(client, worker)).report_digests

        # The measured report: 1% of the rows gone, 1% new handles.
        beats = build_beats(worker, boot, seq, {"containers": report, **KINDS_EMPTY}, known)
        seq += len(beats)
        wire = sum(payload_bytes(b["chunk"]["handles"]) for b in beats if "chunk" in b)
        wall0 = time.time()
        t0 = time.monotonic()
        sent = await send_all(beats)

        async def marked() -> bool:
            n = await pool.fetchval(
                "SELECT count(*) FROM reaper.containers WHERE worker = $1"
                " AND missing_since IS NOT NULL",
                worker,
            )
            return n >= changed

        await wait_until(marked, 120, f"{changed} rows of {worker} marked", poll=0.02)
        e2e = time.monotonic() - t0
        details.append(
            f"{len(beats)} beats ({len(beats) - 1} chunks, {wire / 1e6:.1f} MB of handles, "
            f"unchanged kinds as digests) sent in {sent:.2f} s; {changed:,} rows marked "
            f"{e2e:.2f} s after the first send"
        )
        timeline, why = await _timeline(client, worker, wall0)
        details.append(timeline)
        details.append(
            f"warm-up (first report of {size:,} handles, nothing to mark, until "
            f"reconciled): {warm:.2f} s"
        )
        details.append(
            "plain v1 beat with the whole list inline: "
            + await _plain(client, ctl.task_queue, report)
        )
        m = Metric(
            "3b",
            f"{e2e:.2f} s from first send to marks committed",
            "< 2 s",
            verdict(e2e < 2.0),
            details,
        )
        if e2e >= 2.0:
            m.why = why or "see the timeline"
        return m
    finally:
        await pool.close()


async def _all_runs(client: Client, workflow_id: str) -> list[HistoryEvent]:
    """Events of every run of ``workflow_id`` (a big report can trigger continue-as-new)."""
    runs = [w async for w in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    events: list[HistoryEvent] = []
    for w in sorted(runs, key=lambda w: w.start_time):
        h = await client.get_workflow_handle(workflow_id, run_id=w.run_id).fetch_history()
        events.extend(h.events)
    return events


async def _timeline(client: Client, worker: str, wall0: float) -> tuple[str, str]:
    """Where the time went, from the liveness's and the collector's histories."""
    from temporalio.api.enums.v1 import EventType as E

    from workflows.common import collector_id, liveness_id

    live = await _all_runs(client, liveness_id(worker))
    coll = await _all_runs(client, collector_id(worker))
    names: dict[int, str] = {}
    stage: list[tuple[float, float]] = []
    first_signal = None
    in_flight = peak = 0
    for ev in live:
        if secs(ev) < wall0:
            continue
        if ev.event_type == E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED and first_signal is None:
            first_signal = secs(ev)
        if ev.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names[ev.event_id] = ev.activity_task_scheduled_event_attributes.activity_type.name
            if names[ev.event_id] == "stage_chunk":
                in_flight += 1
                peak = max(peak, in_flight)
        if ev.event_type == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            a = ev.activity_task_completed_event_attributes
            if names.get(a.scheduled_event_id) == "stage_chunk":
                stage.append((secs(ev), 0.0))
                in_flight -= 1
    rec_sched = rec_start = rec_done = None
    cnames: dict[int, str] = {}
    for ev in coll:
        if secs(ev) < wall0:
            continue
        if ev.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            cnames[ev.event_id] = ev.activity_task_scheduled_event_attributes.activity_type.name
            if cnames[ev.event_id] == "reconcile_report" and rec_sched is None:
                rec_sched = secs(ev)
                sched_id = ev.event_id
        if (
            ev.event_type == E.EVENT_TYPE_ACTIVITY_TASK_STARTED
            and rec_sched is not None
            and rec_start is None
            and ev.activity_task_started_event_attributes.scheduled_event_id == sched_id
        ):
            rec_start = secs(ev)
        if (
            ev.event_type == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
            and rec_start is not None
            and rec_done is None
            and ev.activity_task_completed_event_attributes.scheduled_event_id == sched_id
        ):
            rec_done = secs(ev)
    if (
        not stage
        or first_signal is None
        or rec_sched is None
        or rec_start is None
        or rec_done is None
    ):
        return "timeline: not found in the histories", ""
    last_stage = stage[-1][0]
    each = (last_stage - first_signal) / len(stage) * 1000
    text = (
        f"timeline from the histories: first chunk signalled +{first_signal - wall0:.2f} s; "
        f"{len(stage)} stage_chunk activities (at most {peak} at once), done "
        f"+{last_stage - wall0:.2f} s ({each:.0f} ms each); reconcile_report scheduled "
        f"+{rec_sched - wall0:.2f} s, ran {rec_done - rec_start:.2f} s, done "
        f"+{rec_done - wall0:.2f} s"
    )
    why = (
        f"WorkerLiveness stages the {len(stage)} chunks with one stage_chunk activity "
        f"each, at most {peak} at once ({last_stage - first_signal:.2f} s, {each:.0f} ms "
        "per chunk: a workflow task, an activity task, an INSERT, then a DELETE of other "
        "reports' chunks and a count(*) serialised in Postgres per worker and kind); "
        "reconcile_report of the staged report then takes "
        f"{rec_done - rec_start:.2f} s"
    )
    return text, why


async def _where(client: Client, worker: str) -> str:
    """What the liveness and the collector say, for an error message."""
    from workflows.common import collector_id

    try:
        st = await query_state(client, worker)
        h = client.get_workflow_handle(collector_id(worker))
        processed = await h.query("processed", result_type=int)
        backlog = await h.query("backlog", result_type=int)
    except Exception as exc:
        return f"state unknown ({type(exc).__name__}: {exc})"
    return (
        f"last_seq {st.last_seq}, pending_reports {st.pending_reports}, forwarded "
        f"{st.forwarded_reports}, collector processed {processed}, backlog {backlog}, "
        f"rejected {st.rejected} ({st.last_rejection})"
    )


async def _registered(pool: asyncpg.Pool, worker: str) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT count(*) FROM reaper.workers WHERE name = $1 AND state = 'running'", worker
        )
    )


async def _plain(client: Client, tq: str, handles: list[str]) -> str:
    name = "big-plain"
    payload = {
        "worker": name,
        "boot_id": "plain",
        "seq": 0,
        "containers": handles,
        "volumes": [],
        "tasks": [],
    }
    t = time.monotonic()
    try:
        await asyncio.wait_for(send_heartbeat(client, tq, payload, worker=name), 60)
    except Exception as exc:
        text = (str(exc).splitlines() or [type(exc).__name__])[0]
        return f"refused ({payload_bytes(handles) / 1e6:.1f} MB): {text[:160]}"
    return (
        f"accepted by Temporal in {time.monotonic() - t:.2f} s "
        f"({payload_bytes(handles) / 1e6:.1f} MB payload)"
    )
