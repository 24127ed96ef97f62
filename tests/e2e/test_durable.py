"""Durability on a real dev server and a real controller process (CONTRACT.md rule 8).

The dev server suggests continue-as-new every ~30 events here (tests/e2e/conftest.py), so these
tests also cross many run boundaries. Time is real: short timings, polled with deadlines.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.client import WorkflowExecutionStatus

from tests.support.agents import Agents
from tests.support.controller import ControllerProcess
from tests.support.heartbeats import beat, beats_handled, query_state, send
from tests.support.polling import eventually

FAST = {
    "REAPER_HEARTBEAT_INTERVAL": "1s",
    "REAPER_STALL_AFTER": "2s",
    "REAPER_LOST_AFTER": "5s",
    "REAPER_MISSING_TTL": "4s",
    "REAPER_RESYNC_INTERVAL": "1s",
}


@pytest.fixture
def controller_proc(dev_env, db_url, tmp_path) -> ControllerProcess:
    address = dev_env.client.service_client.config.target_host
    proc = ControllerProcess(address, db_url, tmp_path / "controller.log", FAST)
    yield proc
    proc.stop()


async def _events(pool, action: str) -> list[tuple]:
    return [
        tuple(r)
        for r in await pool.fetch(
            "SELECT kind, handle FROM reaper.events WHERE action = $1 ORDER BY id", action
        )
    ]


async def test_rule8_destroy_survives_controller_kill_during_ttl_wait(
    dev_env, pool, controller_proc
):
    client = dev_env.client
    w = f"w-{uuid.uuid4().hex[:6]}"
    await pool.execute(
        "INSERT INTO reaper.volumes (handle, worker) VALUES ('v-1', $1), ('v-2', $1)", w
    )
    controller_proc.start()
    with Agents(client, controller_proc.task_queue) as agents:
        agents.reports[w] = {"volumes": ["v-1"]}
        await eventually(
            lambda: pool.fetchval("SELECT missing_since FROM reaper.volumes WHERE handle = 'v-2'"),
            lambda v: v is not None,
            timeout=60,
            what="v-2 marked",
        )
        controller_proc.kill()  # the collector is waiting out the TTL
        # v-2 falls due (MISSING_TTL 4 s after its mark) while no controller runs
        await eventually(
            lambda: pool.fetchval(
                "SELECT now() >= missing_since + interval '4 seconds' FROM reaper.volumes"
                " WHERE handle = 'v-2'"
            ),
            bool,
            timeout=30,
            poll=0.1,
            what="v-2 due",
        )
        assert await pool.fetchval("SELECT count(*) FROM reaper.volumes WHERE handle='v-2'") == 1
        controller_proc.start()
        loop = asyncio.get_running_loop()
        restarted = loop.time()
        await eventually(
            lambda: pool.fetchval("SELECT count(*) FROM reaper.volumes WHERE handle='v-2'"),
            lambda n: n == 0,
            timeout=60,
            what="v-2 destroyed after restart",
        )
        assert loop.time() - restarted < 30, "work resumed later than 30 s after restart"
        await beats_handled(client, w, 3)  # more beats and resyncs: still exactly once
    assert await _events(pool, "destroyed") == [("volume", "v-2")]
    assert await pool.fetchval("SELECT count(*) FROM reaper.volumes WHERE handle='v-1'") == 1


@pytest.mark.parametrize("kill_after", [0.0, 0.3])
async def test_rule8_reap_survives_controller_kill_mid_reap(
    dev_env, pool, controller_proc, kill_after
):
    client = dev_env.client
    sfx = uuid.uuid4().hex[:6]
    a, b, c = f"a-{sfx}", f"b-{sfx}", f"c-{sfx}"
    await pool.execute("INSERT INTO reaper.services (name, desired_count) VALUES ('web', 3)")
    await pool.execute(
        "INSERT INTO reaper.tasks (id, service, worker, state) VALUES"
        " ('t-a', 'web', $1, 'running'), ('t-b', 'web', $2, 'running'),"
        " ('t-c', 'web', $3, 'running')",
        a,
        b,
        c,
    )
    controller_proc.start()
    with Agents(client, controller_proc.task_queue) as agents:
        agents.reports = {a: {"tasks": ["t-a"]}, b: {"tasks": ["t-b"]}, c: {"tasks": ["t-c"]}}
        await eventually(
            lambda: pool.fetchval("SELECT count(*) FROM reaper.workers WHERE state='running'"),
            lambda n: n == 3,
            timeout=60,
            what="3 workers running",
        )
        del agents.reports[a]  # a dies
        await eventually(
            lambda: pool.fetchval("SELECT state FROM reaper.workers WHERE name=$1", a),
            lambda s: s == "lost",
            timeout=60,
            poll=0.01,
            what="a lost",
        )
        await asyncio.sleep(kill_after)
        controller_proc.kill()  # somewhere in the reap
        await asyncio.sleep(1)
        controller_proc.start()
        await eventually(
            lambda: pool.fetch("SELECT id FROM reaper.tasks WHERE replaces='t-a'"),
            lambda r: len(r) == 1,
            timeout=60,
            what="one replacement",
        )
        for survivor in (b, c):  # more beats handled: still one reap, one replacement
            await beats_handled(client, survivor, 3)
    assert await _events(pool, "lost") == [("task", "t-a")]
    assert len(await _events(pool, "replaced")) == 1
    active = await pool.fetchval(
        "SELECT count(*) FROM reaper.tasks WHERE service='web' AND state IN ('pending','running')"
    )
    assert active == 3


async def test_continue_as_new_loses_no_heartbeat_and_keeps_search_attributes(
    dev_env, pool, controller_proc
):
    client = dev_env.client
    w = f"w-{uuid.uuid4().hex[:6]}"
    await pool.execute("INSERT INTO reaper.containers (handle, worker) VALUES ('c-0', $1)", w)
    controller_proc.start()
    tq = controller_proc.task_queue
    # 120 beats, half of them waited for one by one (a workflow task each), half back to
    # back: at ~30 events a run the liveness continues as new many times while beats keep
    # arriving; every one must count.
    for seq in range(120):
        containers = [f"c-{i}" for i in range(seq % 5)]
        await send(client, tq, beat(w, seq, containers=containers))
        if seq < 60:
            await eventually(
                lambda: query_state(client, w),
                lambda s, q=seq: s.last_seq == q,
                timeout=30,
                what=f"beat {seq}",
            )
    st = await eventually(
        lambda: query_state(client, w),
        lambda s: s.last_seq == 119,
        timeout=60,
        what="all beats handled",
    )
    assert st.rejected == 0 and st.ignored == 0 and st.state == "running"
    desc = await client.get_workflow_handle(f"liveness-{w}").describe()
    assert desc.status == WorkflowExecutionStatus.RUNNING

    async def runs() -> list:
        return [wf async for wf in client.list_workflows(f"WorkflowId = 'liveness-{w}'")]

    await eventually(runs, lambda r: len(r) > 3, timeout=30, what="several runs")

    # search attributes kept current on the newest run (c-0 is in the last report: 119%5=4)
    async def current_attrs():
        d = await client.get_workflow_handle(f"liveness-{w}").describe()
        return d.typed_search_attributes

    from workflows.common import MISSING_ATTR, STATE_ATTR, WORKER_ATTR

    await eventually(
        current_attrs,
        lambda a: (a.get(WORKER_ATTR), a.get(STATE_ATTR), a.get(MISSING_ATTR)) == (w, "running", 0),
        timeout=30,
        what="search attributes current",
    )
    listed = [
        wf
        async for wf in client.list_workflows(
            f"ReaperWorker = '{w}' AND ReaperState = 'running' AND ExecutionStatus = 'Running'"
        )
    ]
    assert len(listed) == 1


async def test_chunked_reports_complete_across_continue_as_new(dev_env, pool, controller_proc):
    """Chunks of large reports sent back to back while the liveness continues as new every
    ~30 events: every report completes (its digest becomes the controller's), and exactly
    the handles the last one lacks are marked (large reports; the time-skipping server mishandles
    signals that race a continue-as-new, so this runs on the real dev server)."""
    from reaper.core.protocol import build_beats, report_digest

    client = dev_env.client
    w = f"w-{uuid.uuid4().hex[:6]}"
    handles = [f"container-{i:07d}" for i in range(20_000)]
    await pool.execute(
        "INSERT INTO reaper.containers (handle, worker) SELECT unnest($1::text[]), $2", handles, w
    )
    controller_proc.start()
    tq = controller_proc.task_queue
    boot, seq = f"boot-{uuid.uuid4().hex[:6]}", 0
    lists = [handles, handles[50:], handles[100:]]  # each drops 50 more
    for report in lists:
        beats = build_beats(w, boot, seq, {"containers": report}, None)
        assert len(beats) >= 3
        for b in beats:
            await send(client, tq, b)
        seq = beats[-1]["seq"] + 1
    digest = report_digest(lists[-1])
    st = await eventually(
        lambda: query_state(client, w),
        lambda s: s.report_digests.get("containers") == digest and s.pending_reports == 0,
        timeout=90,
        what="the last chunked report complete",
    )
    assert st.rejected == 0, st.last_rejection

    async def marked() -> set[str]:
        return {
            r["handle"]
            for r in await pool.fetch(
                "SELECT handle FROM reaper.containers WHERE worker = $1"
                " AND missing_since IS NOT NULL",
                w,
            )
        }

    await eventually(
        marked,
        lambda m: m == set(handles[:100]),
        timeout=60,
        what="exactly the 100 dropped handles marked",
    )

    async def runs() -> list:
        return [wf async for wf in client.list_workflows(f"WorkflowId = 'liveness-{w}'")]

    assert len(await runs()) > 1, "the liveness never continued as new: the test proves nothing"
