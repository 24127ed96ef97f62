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
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from activities.diagnosis import completed_tasks, diagnose, prefix
from workflows.common import liveness_id
from workflows.replay import replay_check

LIVENESS = Path(__file__).parent / "histories" / "liveness.json"


def _stored_liveness() -> WorkflowHistory:
    """``liveness.json`` under its own workflow id (the liveness of its start input's worker:
    under another id a liveness ends at once, and its replay diverges)."""
    text = LIVENESS.read_text()
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
