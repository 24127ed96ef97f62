"""The repair's diagnosis of a liveness history that no longer replays (activities/repair.py,
activities/diagnosis.py; docs/stale-clock.md).

A stuck liveness's history holds a workflow task whose commands the code would not give (the
SDK's stale clock, docs/stale-clock.md, gave one in chaos seed 7). Here one is made from a
stored history of the current code: one ``ActivityTaskScheduled`` is given another activity
type, as if the task that wrote it had decided otherwise. The diagnosis must find the latest
completed workflow task whose prefix replays, the runbook's manual remedy: the
``WorkflowTaskCompleted`` just before the event the replay rejects. (1.2 retired the chaos
campaign's own history, recorded by the 1.0 line: its prefix no longer replays; it is in git
at release 1.1.0.)

``liveness-wft-heartbeat.json`` is a liveness that diverged by itself (docs/stale-clock.md,
"The later clock: a workflow-task heartbeat"): a chaos campaign of 2026-12-07, written by the
1.1 line (commit ed061e2) at peer version 1.0, liveness ``w3``. Its task 18 started a local
activity and was completed after 0.6 s without a command (most likely a query answered while
the activity ran), task 21 followed, and the activity's marker came after task 21's completion
(event 23). Replayed, tasks 18 and 21 are one activation on task 21's clock, which judges the
beats otherwise and starts no local activity: every later task fails on the marker.
"""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from pathlib import Path

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

from activities.diagnosis import completed_tasks, diagnose, prefix
from reaper.core.policy.repair import failures_in_a_row, is_stuck
from workflows.common import liveness_id
from workflows.replay import replay_check

LIVENESS = Path(__file__).parent / "histories" / "liveness.json"
WFT_HEARTBEAT = LIVENESS.with_name("liveness-wft-heartbeat.json")


def _stored_liveness(path: Path = LIVENESS) -> WorkflowHistory:
    """A stored liveness history under its own workflow id (the liveness of its start input's
    worker: under another id a liveness ends at once, and its replay diverges)."""
    text = path.read_text()
    start = json.loads(text)["events"][0]["workflowExecutionStartedEventAttributes"]
    worker = json.loads(base64.b64decode(start["input"]["payloads"][0]["data"]))["worker"]
    return WorkflowHistory.from_json(liveness_id(worker), text)


async def test_the_repair_resets_a_diverged_history_to_the_task_before_the_divergence():
    history = _stored_liveness()
    scheduled = [
        e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    bad = scheduled[1]
    bad.activity_task_scheduled_event_attributes.activity_type.name = "not_what_the_code_runs"
    replay = replay_check()
    found = await diagnose(history, replay)
    assert found.nondeterministic, found.failure
    assert "not_what_the_code_runs" in str(found.failure)
    before = [t for t in completed_tasks(history) if t < bad.event_id]
    assert found.point == before[-1] == bad.event_id - 1
    assert await replay(prefix(history, found.point)) is None
    after = [t for t in completed_tasks(history) if t > bad.event_id]
    assert await replay(prefix(history, after[0])) is not None


async def test_the_repair_leaves_a_history_that_replays_alone():
    found = await diagnose(_stored_liveness(), replay_check())
    assert found.failure is None and found.point is None and not found.nondeterministic


def _outcomes_newest_first(history: WorkflowHistory) -> list[str]:
    outcomes = {
        EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: "completed",
        EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED: "failed",
        EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT: "timed-out",
    }
    return [outcomes[e.event_type] for e in reversed(history.events) if e.event_type in outcomes]


def _reset(history: WorkflowHistory, point: int) -> WorkflowHistory:
    """The history of the run Temporal's reset to the ``WorkflowTaskCompleted`` event
    ``point`` starts, as the worker that takes its first task sees it: the events before
    ``point``, that task failed (``RESET_WORKFLOW``), the later signals reapplied, and a new
    task scheduled and started a second after the old run's last event."""
    kept = [e for e in history.events if e.event_id < point]
    started = kept[-1]
    assert started.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
    scheduled_id = started.workflow_task_started_event_attributes.scheduled_event_id
    failed = HistoryEvent(event_type=EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
    attrs = failed.workflow_task_failed_event_attributes
    attrs.scheduled_event_id, attrs.started_event_id = scheduled_id, started.event_id
    attrs.cause = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW
    attrs.base_run_id, attrs.new_run_id = "the-stuck-run", "the-reset-run"
    signaled = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    later = [e for e in history.events if e.event_id > point and e.event_type == signaled]
    again = [e for e in kept if e.event_id == scheduled_id] + [started]
    tail = [failed] + [HistoryEvent() for _ in later + again]
    for copy, original in zip(tail[1:], later + again, strict=True):
        copy.CopyFrom(original)
    when = history.events[-1].event_time.ToDatetime() + timedelta(seconds=1)
    for event_id, event in enumerate(tail, start=point):
        event.event_id = event_id
        event.event_time.FromDatetime(when)
    tail[-1].workflow_task_started_event_attributes.scheduled_event_id = tail[-2].event_id
    return WorkflowHistory(history.workflow_id, kept + tail)


async def test_the_repair_resets_a_history_a_workflow_task_heartbeat_made_diverge():
    history = _stored_liveness(WFT_HEARTBEAT)
    kinds = {e.event_id: e.event_type for e in history.events}
    # Task 18 completed at 19 with no command and task 21 followed at once (the heartbeat);
    # the local activity's marker came with task 21's completion, event 22.
    assert [kinds[i] for i in (18, 19, 20, 21, 22, 23)] == [
        EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
        EventType.EVENT_TYPE_MARKER_RECORDED,
    ]
    assert is_stuck(True, 1, failures_in_a_row(_outcomes_newest_first(history)))
    replay = replay_check()
    found = await diagnose(history, replay)
    assert found.nondeterministic, found.failure
    assert "Missing associated machine for LocalActivity(2)" in str(found.failure)
    # The latest point whose prefix replays is task 21's completion: the heartbeat's pair of
    # tasks is run again, live, as one activation on the new task's clock; the next completed
    # task's prefix holds the marker that no replay expects.
    assert completed_tasks(history) == [5, 12, 19, 22, 29]
    assert found.point == 22
    assert await replay(prefix(history, 22)) is None
    assert await replay(prefix(history, 29)) is not None
    # The run the reset starts takes its first task without a nondeterminism.
    assert await replay(_reset(history, found.point)) is None
