"""Replay stored histories against today's workflow code (entity workflows live
for ever, so a code change that alters the command sequence of a running history must be
gated with ``workflow.patched``). A failing replay here means exactly that.

Regenerate the stored histories (only when a change is meant to be incompatible and no
deployment runs the old code): ``REAPER_RECORD_HISTORIES=1 pytest tests/workflows/test_replay.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from reaper.core.contract import liveness_id
from tests.support.scheduler import insert, setup_service
from workflows import ALL_WORKFLOWS

HISTORIES = Path(__file__).parent / "histories"
RECORD = os.environ.get("REAPER_RECORD_HISTORIES") == "1"


async def _record(fleet) -> None:
    """A life in short: beats, a mark, a destroy, a stall, a return, a reap."""
    a, b = fleet.name("a"), fleet.name("b")
    await insert(fleet.pool, "volumes", a, ["v-1", "v-2"])
    await setup_service(fleet.pool, "web", {a: ["t-a"], b: []})
    await fleet.beat(a, volumes=["v-1", "v-2"], tasks=[])
    await fleet.beat(a, volumes=["v-1"], tasks=["t-a"])
    await fleet.beat(b, tasks=[])
    await fleet.advance(320, beating={a: {"volumes": ["v-1"], "tasks": ["t-a"]}, b: {"tasks": []}})
    await fleet.advance(60, beating={b: {"tasks": []}})  # a stalls
    await fleet.beat(a, volumes=["v-1"], tasks=["t-a"])  # and returns
    await fleet.advance(320, beating={b: {"tasks": []}})  # a is lost and reaped
    HISTORIES.mkdir(exist_ok=True)
    for wid, name in (
        (f"liveness-{a}", "liveness"),
        (f"gc-{a}", "collector"),
        (f"reap-{a}-1", "reap"),
    ):
        history = await fleet.client.get_workflow_handle(wid).fetch_history()
        (HISTORIES / f"{name}.json").write_text(history.to_json())


@pytest.mark.skipif(not RECORD, reason="set REAPER_RECORD_HISTORIES=1 to record")
async def test_record_histories(fleet):
    await _record(fleet)


# collector: kinds in turn, before the `kinds-apart` patch; collector-kinds-apart: after it.
# fleet: a fleet monitor recorded at commit 082a540, before the `repair-stuck` patch (two
# workers, one lost and reaped; not rewritten by REAPER_RECORD_HISTORIES).
# liveness-lean-start: the life above recorded at commit a51bfc2 (patch `lean-start`, row
# refreshes at half of STALL_AFTER as local activities), before `refresh-at-bound`.
@pytest.mark.parametrize(
    "name",
    ["liveness", "liveness-lean-start", "collector", "collector-kinds-apart", "reap", "fleet"],
)
async def test_stored_history_replays_on_current_code(name):
    path = HISTORIES / f"{name}.json"
    raw = path.read_text()
    # The liveness checks that it runs under its own id (liveness-{worker}): replay it so.
    start = WorkflowHistory.from_json("x", raw).events[0]
    payload = start.workflow_execution_started_event_attributes.input.payloads[0]
    worker = json.loads(payload.data).get("worker", "")
    wid = liveness_id(worker) if name.startswith("liveness") else f"stored-{name}"
    history = WorkflowHistory.from_json(wid, raw)
    replayer = Replayer(workflows=ALL_WORKFLOWS, data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
