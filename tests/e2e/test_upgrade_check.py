"""``reaper upgrade-check`` (CHANGELOG.md, "Upgrade"): it names every running run this
release's code could not take over, and says ready once none is left.

A controller whose liveness decides differently from reaper's (``tests/support/diverging.py``:
``early-*`` workers diverge in each run's first workflow task) stands for a release whose
runs this code cannot replay; an ``ok-*`` worker's liveness decides as reaper's does.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from temporalio.worker import Worker

from activities import ReaperActivities
from tests.support.cli import run_cli
from tests.support.controller import make_settings
from tests.support.diverging import DivergingLiveness, diverged, events_of
from tests.support.heartbeats import beat, query_state, send
from tests.support.polling import eventually
from worker import ControllerHooks
from workflows import ALL_WORKFLOWS, WorkerLiveness
from workflows.common import liveness_id


async def test_upgrade_check_names_the_runs_this_release_could_not_take_over(dev_env, pool):
    client = dev_env.client
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    suffix = uuid.uuid4().hex[:6]
    early, ok = f"early-{suffix}", f"ok-{suffix}"
    diverging = [DivergingLiveness if w is WorkerLiveness else w for w in ALL_WORKFLOWS]
    async with Worker(
        client,
        task_queue=tq,
        workflows=diverging,
        activities=ReaperActivities(pool, make_settings()).all(),
        interceptors=[ControllerHooks()],
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
    ):
        for w in (early, ok):
            await send(client, tq, beat(w, 0))
            await eventually(
                lambda w=w: query_state(client, w), lambda s: s.state == "running", what=w
            )
        await eventually(lambda: events_of(client, liveness_id(early)), diverged, what="diverged")
    address = client.service_client.config.target_host
    args = ("upgrade-check", "--address", address, "--task-queue", tq)

    found = await run_cli(*args)
    assert found.returncode == 1, found.stdout + found.stderr
    named = [ln for ln in found.stdout.splitlines() if ln.startswith("not replayable")]
    assert len(named) == 1 and liveness_id(early) in named[0], found.stdout
    assert "Nondeterminism" in named[0], named
    assert "not ready: 1 would fail" in found.stdout, found.stdout
    assert liveness_id(ok) not in found.stdout

    await client.get_workflow_handle(liveness_id(early)).terminate("test: gone")
    again = await run_cli(*args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.strip().endswith(": ready"), again.stdout
