"""The reference agent (reaper/agent.py) against a real dev server, controller and Postgres."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import asyncpg
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from reaper.cli.agent import Agent, client_factory, list_entries
from reaper.core.contract import StateView
from reaper.core.protocol import report_digest
from reaper.kit.processes import free_port
from tests.support.controller import controller, make_settings
from tests.support.heartbeats import query_state
from tests.support.polling import eventually
from workflows.common import liveness_id

FAST = dict(
    heartbeat_interval=0.2, stall_after=5, lost_after=30, missing_ttl=5, resync_interval=0.4
)
"""The agent beats every 0.2 s; nothing goes stalled or missing during a test."""


def _agent(tmp_path: Path, client: Client, tq: str, worker: str | None = None) -> Agent:
    async def same_client() -> Client:
        return client

    return Agent(
        worker=worker or f"agent-{uuid.uuid4().hex[:8]}",
        state_dir=tmp_path / "state",
        task_queue=tq,
        interval=FAST["heartbeat_interval"],
        client_factory=same_client,
    )


async def _heartbeats(client: Client, worker: str) -> list[dict[str, Any]]:
    """The heartbeat payloads in the liveness history, over every run (the dev server here
    continues-as-new every ~30 events), oldest first."""
    beats = []
    runs = [wf async for wf in client.list_workflows(f"WorkflowId = '{liveness_id(worker)}'")]
    for run in runs:
        handle = client.get_workflow_handle(liveness_id(worker), run_id=run.run_id)
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                attrs = event.workflow_execution_signaled_event_attributes
                if attrs.signal_name == "heartbeat":
                    beats.append(json.loads(attrs.input.payloads[0].data))
    return sorted(beats, key=lambda b: b["seq"])


def test_beats_number_from_zero_with_a_fresh_boot_id(tmp_path: Path) -> None:
    async def never() -> Client:
        raise AssertionError("no connection in this test")

    a = Agent(worker="w1", state_dir=tmp_path, task_queue="q", interval=1, client_factory=never)
    b = Agent(worker="w1", state_dir=tmp_path, task_queue="q", interval=1, client_factory=never)
    assert a.boot_id != b.boot_id
    assert [b["seq"] for _ in range(3) for b in a.next_beats()] == [0, 1, 2]
    assert {p.name for p in tmp_path.iterdir()} == {"containers", "volumes", "tasks"}


def test_snapshot_lists_every_entry_but_dotfiles(tmp_path: Path) -> None:
    for rel in ("containers/c-2", "containers/c-1", "containers/.tmp", "tasks/t-1"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).touch()
    (tmp_path / "volumes" / "v-dir").mkdir(parents=True)
    [beat] = Agent(
        worker="w1", state_dir=tmp_path, task_queue="q", interval=1, client_factory=None
    ).next_beats()  # type: ignore[arg-type]
    assert (beat["containers"], beat["volumes"], beat["tasks"]) == (
        ["c-1", "c-2"],
        ["v-dir"],
        ["t-1"],
    )
    assert list_entries(tmp_path / "absent") == []


async def test_agent_reports_its_directories_and_applies_assignments_and_orphans(
    dev_env: WorkflowEnvironment, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    client, tq = dev_env.client, f"tq-{uuid.uuid4().hex[:8]}"
    agent = _agent(tmp_path, client, tq)
    w, d = agent.worker, agent.state_dir
    for rel in ("containers/c-1", "containers/c-2", "volumes/v-1", "tasks/t-old"):
        (d / rel).touch()
    await pool.execute(
        "INSERT INTO reaper.containers (handle, worker, state) VALUES"
        " ('c-1', $1, 'created'), ('c-2', $1, 'created')",
        w,
    )
    await pool.execute(
        "INSERT INTO reaper.volumes (handle, worker, state) VALUES ('v-1', $1, 'created')", w
    )
    # A task reaped while this worker was away: the agent still holds it.
    await pool.execute(
        "INSERT INTO reaper.tasks (id, worker, state, stop_reason) VALUES"
        " ('t-old', $1, 'lost', 'worker-lost')",
        w,
    )
    stop = asyncio.Event()
    async with controller(client, pool, make_settings(**FAST), tq):
        runner = asyncio.create_task(agent.run(stop))
        try:
            view = await eventually(
                lambda: _state(client, w),
                # A liveness shows its first beat once its run has read the settings (who may
                # speak depends on them): until then it answers with no boot and no seq.
                lambda v: v is not None and v.state == "running" and v.last_seq is not None,
                what="first beat handled",
            )
            assert view.boot_id == agent.boot_id
            beats = await _heartbeats(client, w)
            assert [b["seq"] for b in beats] == sorted({b["seq"] for b in beats})
            assert beats[0]["seq"] == 0 and beats[0]["boot_id"] == agent.boot_id
            assert beats[0]["containers"] == ["c-1", "c-2"]
            assert beats[0]["volumes"] == ["v-1"]
            assert beats[0]["tasks"] == ["t-old"]

            # Orphans: the reaped task is listed, and the agent removes its entry.
            await eventually(
                lambda: _exists(d / "tasks" / "t-old"),
                lambda e: not e,
                what="orphan t-old removed by the agent",
            )
            assert (
                await pool.fetchval("SELECT state FROM reaper.tasks WHERE id = 't-old'") == "lost"
            )

            # Assignments: a pending task placed here is started (entry), then running.
            await pool.execute(
                "INSERT INTO reaper.tasks (id, worker, state) VALUES ('t-new', $1, 'pending')", w
            )
            await eventually(
                lambda: _exists(d / "tasks" / "t-new"),
                bool,
                what="assigned t-new started by the agent",
            )
            await eventually(
                lambda: pool.fetchval("SELECT state FROM reaper.tasks WHERE id = 't-new'"),
                lambda st: st == "running",
                what="t-new running",
            )

            # A removed entry is reported as gone: its row gets marked missing.
            (d / "containers" / "c-2").unlink()
            await eventually(
                lambda: pool.fetchval(
                    "SELECT missing_since IS NOT NULL FROM reaper.containers WHERE handle = 'c-2'"
                ),
                bool,
                what="c-2 marked missing after its entry was removed",
            )
            assert not await pool.fetchval(
                "SELECT missing_since IS NOT NULL FROM reaper.containers WHERE handle = 'c-1'"
            )
            beats = await _heartbeats(client, w)
            # Inline when changed, digest only when the controller holds that very list.
            for kind, expected in (("containers", ["c-1"]), ("tasks", ["t-new"])):
                last = beats[-1]
                assert last.get(kind) == expected or last.get("digests", {}).get(
                    kind
                ) == report_digest(expected), last
            assert not runner.done()
        finally:
            stop.set()
            await asyncio.wait_for(runner, timeout=10)


async def test_agent_survives_temporal_being_unreachable(tmp_path: Path) -> None:
    agent = Agent(
        worker="lonely",
        state_dir=tmp_path,
        task_queue="q",
        interval=0.1,
        client_factory=client_factory(f"127.0.0.1:{free_port()}", "default", 0.1),
    )
    stop = asyncio.Event()
    runner = asyncio.create_task(agent.run(stop))

    async def failures() -> int:
        return agent.failures

    await eventually(failures, lambda n: n >= 3, what="three failed beats")
    assert not runner.done(), "the agent must keep running while Temporal is down"
    stop.set()
    await asyncio.wait_for(runner, timeout=10)
    assert agent.beats_sent == 0


async def _state(client: Client, worker: str) -> StateView | None:
    """The liveness view, or None while the workflow does not exist yet."""
    try:
        return await query_state(client, worker)
    except RPCError:
        return None


async def _exists(path: Path) -> bool:
    return path.exists()
