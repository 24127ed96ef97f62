"""A stuck liveness is repaired by the controller (activities/repair.py), for real.

A dev server of its own, real Postgres, in-process controllers with short timings. Two workers beat
while a controller whose ``WorkerLiveness`` decides differently from reaper's runs
(tests/support/diverging.py): ``early-*`` diverges in its run's first workflow task, before
the collector is started; ``late-*`` after three beats. That controller stops and so do
two of the agents (dead workers); the real controller takes over and every workflow task
of the three livenesses fails with a nondeterminism error: stuck, as the chaos campaign's
livenesses were. The third worker keeps beating, so its failed tasks never pass attempt 2
(each beat schedules a new one), as in chaos seed 7 on 2026-12-02. Without the repair
neither dead worker is ever judged lost. With it, the fleet monitor resets each liveness
once to the latest point its code can replay; the new runs judge the dead workers lost and
reap their tasks, and the beating worker's row is fresh again and its task never reaped;
the early one's new run finds the collector running (``WorkflowAlreadyStartedError`` path
of workflows/intake.py).
"""

from __future__ import annotations

import re
import time
import uuid
from datetime import timedelta

import pytest
from prometheus_client import REGISTRY
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, Worker

from activities import ReaperActivities
from activities.repair import repair_key
from tests.support.agents import Agents
from tests.support.controller import controller, make_settings, start_monitor
from tests.support.diverging import DivergingLiveness, diverged, events_of
from tests.support.heartbeats import query_state
from tests.support.polling import eventually
from tests.support.scheduler import setup_service
from worker import ControllerHooks
from workflows import ALL_WORKFLOWS, WorkerLiveness
from workflows.common import collector_id, fleet_monitor_id, liveness_id, reap_id

pytestmark = pytest.mark.own_stack
"""A dev server of its own (``long_runs``): make test runs it beside the smoke runs."""

TIMINGS = dict(
    heartbeat_interval=1,
    stall_after=3,
    lost_after=6,
    missing_ttl=3,
    resync_interval=1,
    # Two of the three workers die: below full disruption (rule 6), so they are reaped.
    disruption_threshold=1.0,
)
E = EventType


def repaired_total() -> float:
    return REGISTRY.get_sample_value("reaper_livenesses_repaired_total") or 0.0


async def test_a_stuck_liveness_is_reset_and_its_dead_worker_reaped(long_runs, pool) -> None:
    client = long_runs
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    suffix = uuid.uuid4().hex[:6]
    early, late, ok = f"early-{suffix}", f"late-{suffix}", f"ok-{suffix}"
    beating = f"late-b-{suffix}"
    workers = (early, late)
    all_stuck = (*workers, beating)
    await setup_service(pool, f"web-{suffix}", {w: [f"t-{w}"] for w in all_stuck})
    settings = make_settings(**TIMINGS)
    before = repaired_total()
    started = time.monotonic()

    # 1. A controller with a liveness that is not reaper's: the workers register, start
    #    their tasks and collectors, and two histories diverge from reaper's code. No run
    #    continues as new here, so the diverged runs are the ones reaper's code meets.
    diverging = [DivergingLiveness if w is WorkerLiveness else w for w in ALL_WORKFLOWS]
    with Agents(client, tq, interval=1.0) as agents:
        for w in all_stuck:
            agents.reports[w] = {"containers": [], "volumes": [], "tasks": [f"t-{w}"]}
        agents.reports[ok] = {"containers": [], "volumes": [], "tasks": []}
        async with Worker(
            client,
            task_queue=tq,
            workflows=diverging,
            activities=ReaperActivities(pool, settings).all(),
            interceptors=[ControllerHooks()],
            sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
        ):
            for w in all_stuck:
                await eventually(
                    lambda w=w: pool.fetchval("SELECT state FROM reaper.tasks WHERE worker=$1", w),
                    lambda s: s == "running",
                    timeout=60,
                    what=f"{w}'s task running",
                )
                await eventually(
                    lambda w=w: events_of(client, liveness_id(w)),
                    diverged,
                    timeout=60,
                    what=f"{w}'s liveness diverged",
                )
        # That controller stops while the agents still beat (so it judges nobody); then
        # two of the workers die.
        for w in workers:
            del agents.reports[w]
            assert diverged(await events_of(client, liveness_id(w)))
        diverged_at = time.monotonic()

        # 2. Reaper's controller and its fleet monitor take over.
        async with controller(client, pool, settings, tq):
            await start_monitor(client, settings, tq)
            for w in workers:
                await eventually(
                    lambda w=w: client.get_workflow_handle(liveness_id(w)).describe(),
                    lambda d: d.raw_description.pending_workflow_task.attempt >= 2,
                    timeout=60,
                    what=f"{w}'s liveness failing on reaper's code",
                )
            rows = await eventually(
                lambda: pool.fetch(
                    "SELECT worker, reason, actor FROM reaper.events"
                    " WHERE action = 'repaired' ORDER BY id"
                ),
                lambda rs: {r["worker"] for r in rs} >= set(all_stuck),
                timeout=120,
                poll=0.5,
                what="the three livenesses repaired",
            )
            repaired_at = time.monotonic()
            await eventually(
                lambda: pool.fetch(
                    "SELECT name FROM reaper.workers"
                    " WHERE name = ANY($1::text[]) AND state = 'lost'",
                    list(workers),
                ),
                lambda rs: len(rs) == len(workers),
                timeout=30,
                poll=0.2,
                what="both workers lost",
            )
            await eventually(
                lambda: pool.fetch(
                    "SELECT id FROM reaper.tasks WHERE worker = ANY($1::text[])"
                    " AND state = 'lost' AND stop_reason = 'worker-lost'",
                    list(workers),
                ),
                lambda rs: len(rs) == len(workers),
                timeout=30,
                poll=0.2,
                what="both tasks reaped",
            )
            reaped_at = time.monotonic()
            print(
                f"\ndiverged after {diverged_at - started:.1f}s, repaired"
                f" {repaired_at - diverged_at:.1f}s later, reaped {reaped_at - repaired_at:.1f}s"
                " after that"
            )

            # One repair per worker, naming the event and the error, by the controller; the
            # run it reset had diverged and failed its workflow tasks, and was terminated.
            assert sorted(r["worker"] for r in rows) == sorted(all_stuck), rows
            points, stuck_runs = {}, {}
            for r in rows:
                assert r["actor"] == "reaper"
                found = re.match(r"reset to event (\d+) \(run ([0-9a-f-]+)\)", r["reason"])
                assert found and "Nondeterminism" in r["reason"], r["reason"]
                w = r["worker"]
                points[w], stuck_runs[w] = int(found.group(1)), found.group(2)
                stuck = await events_of(client, liveness_id(w), stuck_runs[w])
                assert diverged(stuck)
                assert any(e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_FAILED for e in stuck)
            assert repaired_total() - before == len(all_stuck)

            # The beating worker is running again: its row within STALL_AFTER of its
            # liveness, never judged lost, its task never reaped (rule 5).
            async def freshness() -> tuple[str, float]:
                st = await query_state(client, beating)
                row = await pool.fetchrow(
                    "SELECT state, last_heartbeat_at FROM reaper.workers WHERE name = $1",
                    beating,
                )
                lag = (st.last_heartbeat_at - row["last_heartbeat_at"]).total_seconds()
                return row["state"], lag

            await eventually(
                freshness,
                lambda f: f[0] == "running" and f[1] <= TIMINGS["stall_after"],
                timeout=30,
                poll=0.2,
                what=f"{beating}'s row fresh again",
            )
            assert (
                await pool.fetchval("SELECT state FROM reaper.tasks WHERE id = $1", f"t-{beating}")
                == "running"
            )

            # The early liveness was reset to before it started its collector; its new run
            # found the collector running and went on.
            old = await events_of(client, liveness_id(early), stuck_runs[early])
            starts = [
                e.event_id
                for e in old
                if e.event_type == E.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
                and e.start_child_workflow_execution_initiated_event_attributes.workflow_id
                == collector_id(early)
            ]
            assert starts and points[early] < starts[0], (points, starts)
            new = await events_of(client, liveness_id(early))
            assert any(
                e.event_type == E.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_FAILED for e in new
            )

            # Each new run replays on reaper's code and never failed a workflow task.
            replayer = Replayer(workflows=ALL_WORKFLOWS, data_converter=pydantic_data_converter)
            for w in all_stuck:
                handle = client.get_workflow_handle(liveness_id(w))
                desc = await handle.describe()
                assert desc.run_id != stuck_runs[w]
                history = await handle.fetch_history()
                assert not any(
                    e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_FAILED
                    and e.event_id > points[w] + 1  # the reset's own failure of the rerun task
                    for e in history.events
                ), w
                result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
                assert result.replay_failure is None, (w, result.replay_failure)
                old_desc = await client.get_workflow_handle(
                    liveness_id(w), run_id=stuck_runs[w]
                ).describe()
                assert old_desc.status == WorkflowExecutionStatus.TERMINATED

    # Nothing was taken down twice: one row per task reaped, no destroy repeated.
    actions = await pool.fetch(
        "SELECT kind, handle, action, count(*) AS n FROM reaper.events"
        " WHERE action IN ('destroyed', 'lost', 'stopped', 'replaced', 'repaired')"
        " GROUP BY kind, handle, action"
    )
    assert all(r["n"] == 1 for r in actions), [dict(r) for r in actions]
    lost = {r["handle"] for r in actions if r["action"] == "lost"}
    assert lost == {f"t-{w}" for w in workers}

    # A retried repair changes nothing more: with its row written, it stops there;
    # with its row lost (a crash after the reset, before the commit), it finds the
    # stuck run replaced by the new one and leaves it: no second reset, no row.
    acts = ReaperActivities(pool, settings)
    w, run, point = late, stuck_runs[late], points[late]
    key = repair_key(liveness_id(w), run)
    current = (await client.get_workflow_handle(liveness_id(w)).describe()).run_id
    assert await acts.reset_once(client, w, run, point, "retry") is None
    await pool.execute("DELETE FROM reaper.events WHERE dedupe = $1", key)
    assert await acts.reset_once(client, w, run, point, "retry after a crash") is None
    again = await client.get_workflow_handle(liveness_id(w)).describe()
    assert again.run_id == current
    assert again.status == WorkflowExecutionStatus.RUNNING
    assert not await pool.fetchval("SELECT 1 FROM reaper.events WHERE dedupe = $1", key)

    ids = [fleet_monitor_id(tq)]
    ids += [wid for w in workers for wid in (liveness_id(w), collector_id(w), reap_id(w, 1))]
    ids += [liveness_id(ok), collector_id(ok), liveness_id(beating), collector_id(beating)]
    for wid in ids:
        try:
            await client.get_workflow_handle(wid).terminate("test over")
        except Exception:
            pass
