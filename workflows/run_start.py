"""What a liveness run reads before it acts: its timings, the worker's pin and, on a first
run, the worker's row (a retired boot is ignored, §5.1).

Since the ``one-read-start`` patch all three come from one activity (``begin_liveness``):
registering a worker costs two local activities fewer (issue 11). Runs recorded before it
replay the three reads they made. An activity, not a local one: beats that arrive during
the read wait for it (who may speak depends on the settings), and a local activity's result
has no place of its own in history, so a replay after an eviction could apply the waiting
beats around another beat than the run did (a nondeterminism seen with a one-workflow cache,
tests/e2e/test_replay_always.py); an activity's completion is an event, ordered among the
signals.

With ``one-task-start`` (issue 20; ``rollout.ONE_TASK_START_ON`` can switch it off), where
every peer is of this line, a first run makes the
same read as a local activity and so registers its worker in its first workflow task: the
beats of a new worker arrive in later tasks (all but the one that started the run), and the
test of a fleet replayed on every activation (tests/e2e/test_replay_always.py) covers the
registrations of its fresh workers. Its cost: a local activity holds the run in the
controller's workflow cache while it waits, so with a full cache and a slow read the
next workflow task times out once (10 s; tests/e2e/test_one_task_start.py), as a
registration's local row write could already.
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
"""Patch: a run's three start-up reads in one activity (``begin_liveness``)."""
LEAN_START = "lean-start"
"""Patch: one marker decides every feature of a run (the change feed, one read at start,
local row writes), so a run records one patch marker and one search-attribute upsert
instead of three (each ``workflow.patched`` upserts ``TemporalChangeVersion``, a
visibility write); a run that takes it writes its worker's registration and heartbeat
refreshes with local activities (``LivenessSteps.local_writes``)."""
REFRESH_AT_BOUND = "refresh-at-bound"
"""Patch: everything ``lean-start`` does (one marker still decides a run's features), and
heartbeat refreshes only once the row's lag nears ``STALL_AFTER``
(``policy.liveness.row_refresh_due`` with the heartbeat interval): every third beat at the
defaults instead of every other one."""
ONE_TASK_START = rollout.ONE_TASK_START
"""Patch: everything ``refresh-at-bound`` does (one marker still decides a run's features),
and a first run's start-up read is a local activity, so the worker is registered in the
run's first workflow task (``rollout.ONE_TASK_START``; only where this controller's peer
version allows it)."""
READ_TIMEOUT = timedelta(seconds=10)


async def begin_run(live: LivenessState, gate: Gate, first: bool) -> WorkerRecord | None:
    """Load ``live.timings`` and the pin (through ``gate``); on a ``first`` run also the
    worker's row, for ``Retirement.registers_afresh`` (``None``: not read here, it reads
    the row itself, as runs before ``one-read-start`` did). Decides, at this fixed point of
    the run, its ``live.features`` from its patch markers, never from a signal handler,
    whose activation a replay may place elsewhere: ``refresh-at-bound`` implies
    ``lean-start`` (a new run records that marker alone), which implies the change feed;
    and, from the peer version its read recorded, the command changes of
    ``reaper.core.policy.rollout`` (``rearm-on-beat``, ``wide-staging``,
    ``drop-superseded-chunks``). A ``first`` run
    that takes ``one-task-start`` (which implies ``refresh-at-bound``) makes the read as a
    local activity.

    Returns:
        The worker's row, or ``None``.
    """
    one_task = first and _starts_in_one_task()
    at_bound = one_task or workflow.patched(REFRESH_AT_BOUND)
    lean = at_bound or workflow.patched(LEAN_START)
    live.features = RunFeatures(
        local_writes=lean,
        refresh_at_bound=at_bound,
        change_feed=lean or workflow.patched(CHANGE_FEED),
    )
    if not lean and not workflow.patched(ONE_READ_START):
        live.timings = await workflow.execute_local_activity_method(
            ReaperActivities.load_timings, start_to_close_timeout=READ_TIMEOUT
        )
        await gate.load_pin()
        _decide_rollout(live)
        return None
    req = BeginRun(worker=live.worker, first=first, key_known=live.agent_key is not None)
    summary = f"read settings and {live.worker}'s row and pin"
    if one_task:
        start = await run_local_activity(
            ReaperActivities.begin_liveness, req, summary=summary, timeout=READ_TIMEOUT
        )
    else:
        start = await run_activity(ReaperActivities.begin_liveness, req, summary=summary)
    live.timings = start.timings
    gate.use_pin(start.agent_key)
    _decide_rollout(live)
    return start.record


def _starts_in_one_task() -> bool:
    """Whether this first run registers its worker in its first workflow task
    (``one-task-start``). Outside replay the controller's peer version decides (the extern
    function of ``reaper.infra.temporal.PeerVersionGate``; none: the oldest line), and a yes
    is recorded as the patch marker; in replay only that marker counts, whatever the
    setting is today. A first run has nothing else recorded yet that could carry the
    decision: its start input is the agent's ``{"worker": name}``."""
    if not workflow.unsafe.is_replaying():
        if not rollout.ONE_TASK_START_ON:
            return False
        ask = workflow.extern_functions().get(rollout.PEER_VERSION_EXTERN)
        peer = str(ask()) if ask is not None else rollout.DEFAULT_PEER_VERSION
        if not rollout.uses(ONE_TASK_START, peer):
            return False
    return workflow.patched(ONE_TASK_START)


def _decide_rollout(live: LivenessState) -> None:
    """The run's command changes that every peer knows, by the peer version its start-up
    read recorded (``reaper.core.policy.rollout``; absent from older histories: the oldest)."""
    peer = live.timings.peer_version if live.timings is not None else ""
    live.features.rearm_on_beat = rollout.uses(rollout.REARM_ON_BEAT, peer)
    live.features.wide_staging = rollout.uses(rollout.WIDE_STAGING, peer)
    live.features.drop_superseded_chunks = rollout.uses(rollout.DROP_SUPERSEDED_CHUNKS, peer)
    live.features.one_grace = rollout.uses(rollout.ONE_GRACE, peer)
    live.features.drain_in_order = rollout.uses(rollout.DRAIN_IN_ORDER, peer)
    # Its patch marker is asked for where a loss is first written (workflows.reap.loss_in_task).
    live.features.in_task_loss = rollout.uses(rollout.IN_TASK_LOSS, peer)


def start_input(args: Sequence[Any]) -> LivenessInput:
    """The start input ``{"worker": name}`` (CONTRACT.md §2), or the carried state of a
    continue-as-new. One that does not parse is ignored (logged, counted): the worker is then
    the one this workflow's id names, ``liveness-{worker}``, so a bad start never wedges a
    worker's liveness (a run whose id names no worker ends at once)."""
    inp = front_door.start_input(LivenessInput.model_validate, args)
    if inp is not None:
        return inp
    return LivenessInput(worker=front_door.worker_from_id(LIVENESS_PREFIX) or "")
