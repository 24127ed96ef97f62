"""What a liveness run reads before it acts: its timings, the worker's pin and, on a first
run, the worker's row (a retired boot is ignored, §5.1), in one activity
(``begin_liveness``).

A first run makes that read as a local activity, so it registers its worker in its first
workflow task (``one-task-start``, issue 20): the beats of a new worker arrive in later tasks
(all but the one that started the run). Its cost: a local activity holds the run in the
controller's workflow cache while it waits, so with a full cache and a slow read the next
workflow task times out once (10 s; tests/e2e/test_one_task_start.py). A later run (after a
continue-as-new) makes it as an activity: beats that arrive during the read wait for it (who
may speak depends on the settings), and an activity's completion is an event ordered among
the signals, so a replay after an eviction applies the waiting beats where the run did.

Patches (CHANGELOG.md, "Workflow patches"): every id this module names is deprecated since
1.2, which takes the patched path always; a run of 1.1.0 at peer version 1.1 took the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities import ReaperActivities
    from activities.types import BeginRun, WorkerRecord
    from reaper.core.contract import LIVENESS_PREFIX
    from reaper.core.liveness_state import LivenessInput, LivenessState, RunFeatures
    from reaper.core.policy import rollout
    from workflows import front_door
    from workflows.common import CHANGE_FEED, run_activity, run_local_activity
    from workflows.gate import Gate

ONE_READ_START = "one-read-start"
"""Patch (deprecated): a run's three start-up reads in one activity (``begin_liveness``)."""
LEAN_START = "lean-start"
"""Patch (deprecated): one marker decides every feature of a run; registrations and
heartbeat refreshes are local activities."""
REFRESH_AT_BOUND = "refresh-at-bound"
"""Patch (deprecated): what ``lean-start`` does, and heartbeat refreshes only once the row's
lag nears ``STALL_AFTER`` (``policy.liveness.row_refresh_due``)."""
ONE_TASK_START = "one-task-start"
"""Patch (deprecated): what ``refresh-at-bound`` does, and a first run's start-up read is a
local activity, so the worker is registered in the run's first workflow task."""
READ_TIMEOUT = timedelta(seconds=10)


async def begin_run(live: LivenessState, gate: Gate, first: bool) -> WorkerRecord | None:
    """Load ``live.timings`` and the pin (through ``gate``); on a ``first`` run also the
    worker's row, for ``Retirement.registers_afresh``. A ``first`` run reads with a local
    activity (``one-task-start``), a later one with an activity. The run's
    ``live.features`` are decided here, at this fixed point of the run, from the peer
    version its read recorded (``reaper.core.policy.rollout``).

    Returns:
        The worker's row on a first run, else ``None``.
    """
    # The marker a 1.1.0 controller at peer version 1.1 wrote here, so that it replays a run
    # this release starts during a rolling upgrade. The ids it asked only where that marker
    # was absent are deprecated in the same place (a replay that does not ask for a
    # deprecated marker ignores it); a first run, the registration, records one marker.
    req = BeginRun(worker=live.worker, first=first, key_known=live.agent_key is not None)
    summary = f"read settings and {live.worker}'s row and pin"
    if first:
        workflow.deprecate_patch(ONE_TASK_START)
        start = await run_local_activity(
            ReaperActivities.begin_liveness, req, summary=summary, timeout=READ_TIMEOUT
        )
    else:
        workflow.deprecate_patch(REFRESH_AT_BOUND)
        workflow.deprecate_patch(LEAN_START)
        workflow.deprecate_patch(ONE_READ_START)
        workflow.deprecate_patch(CHANGE_FEED)
        start = await run_activity(ReaperActivities.begin_liveness, req, summary=summary)
    live.timings = start.timings
    gate.use_pin(start.agent_key)
    live.features = RunFeatures(changes=rollout.in_use(start.timings.peer_version))
    return start.record


def start_input(args: Sequence[Any]) -> LivenessInput:
    """The start input ``{"worker": name}`` (CONTRACT.md §2), or the carried state of a
    continue-as-new. One that does not parse is ignored (logged, counted): the worker is then
    the one this workflow's id names, ``liveness-{worker}``, so a bad start never wedges a
    worker's liveness (a run whose id names no worker ends at once)."""
    inp = front_door.start_input(LivenessInput.model_validate, args)
    if inp is not None:
        return inp
    return LivenessInput(worker=front_door.worker_from_id(LIVENESS_PREFIX) or "")
