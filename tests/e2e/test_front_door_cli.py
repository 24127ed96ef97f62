"""The front door through the real ``temporal`` CLI with raw JSON (CONTRACT.md §2): malformed
heartbeats and operator signals, made by hypothesis, sent as an operator's shell would. None
fails or blocks a workflow task, none advances the fence, none changes a row."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from reaper.core.signing import new_private_key, sign_heartbeat
from tests.support.controller import controller, find_binary, make_settings, start_monitor
from tests.support.heartbeats import failed_tasks, query_state, send
from tests.support.polling import eventually
from workflows.common import collector_id, liveness_id

SLOW = dict(heartbeat_interval=1, stall_after=60, lost_after=120, missing_ttl=60, resync_interval=1)
junk = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@st.composite
def raw_json(draw: st.DrawFn, worker: str) -> str:
    """A heartbeat-ish JSON text: right shape with wrong members, or anything at all."""
    if draw(st.booleans()):
        return json.dumps(draw(junk))
    beat: dict[str, Any] = {"worker": worker, "boot_id": "b-1", "seq": 10**12}
    beat[draw(st.sampled_from(["worker", "boot_id", "seq", "containers", "sig", "agent_key"]))] = (
        draw(junk)
    )
    return json.dumps(beat)


async def cli_signal(env: dict[str, str], worker: str, name: str, text: str) -> None:
    await cli(
        env,
        "workflow",
        "signal",
        "--workflow-id",
        liveness_id(worker),
        "--name",
        name,
        "--input",
        text,
    )


CLOSING = "workflow is closing"
"""The server refuses a signal while the run continues as new (every ~30 events on the
test's dev server); the next run takes it, so the CLI sends it again, as an operator would."""


async def cli(env: dict[str, str], *argv: str, attempts: int = 5) -> None:
    """Run the ``temporal`` CLI; it must succeed (the server accepted what it sent), once
    the run it targets is not in the middle of a continue-as-new."""
    for attempt in range(attempts):
        proc = await asyncio.create_subprocess_exec(
            find_binary("temporal"),
            *argv,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), timeout=30)
        if proc.returncode == 0 or CLOSING not in err.decode() or attempt == attempts - 1:
            break
        await asyncio.sleep(0.2)
    assert proc.returncode == 0, err.decode()


async def test_raw_json_through_the_temporal_cli_changes_nothing(
    dev_env: WorkflowEnvironment, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    client, tq = dev_env.client, f"tq-door-{uuid.uuid4().hex[:8]}"
    w = f"door-{uuid.uuid4().hex[:8]}"
    env = cli_env(client, tmp_path)
    beat = await signed_worker_holding_c1(pool, w)

    # `required`: an unsigned operator signal is rejected (in `pin` one would act, as in v1).
    async with controller(client, pool, make_settings(agent_auth="required", **SLOW), tq):
        await send(client, tq, beat(0))
        first = await eventually(
            lambda: query_state(client, w), lambda s: s.last_seq == 0, what="registered"
        )
        sent: list[tuple[str, str]] = []

        @settings(
            max_examples=12,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.sampled_from(["heartbeat", "force_reap", "drain"]), raw_json(w))
        def collect(name: str, text: str) -> None:
            sent.append((name, text))

        collect()
        for name, text in sent:
            await cli_signal(env, w, name, text)
        # Every one of them is handled (rejected, ignored, or a harmless v1 drain) and the
        # worker's liveness is where it was.
        await send(client, tq, beat(1))
        st_ = await eventually(
            lambda: query_state(client, w), lambda s: s.last_seq == 1, what="the agent heard"
        )
        assert (st_.boot_id, st_.state, st_.missing) == (first.boot_id, "running", 0)
        assert not st_.draining
        assert (
            await pool.fetchval("SELECT missing_since FROM reaper.containers WHERE handle = 'c-1'")
            is None
        )
        assert st_.rejected > 0
        # The server's own refusals (a signal during a completion) are benign; none other.
        assert await failed_tasks(client, liveness_id(w)) == []


def cli_env(client: Any, home: Path) -> dict[str, str]:
    """The ``temporal`` CLI's environment for the test's dev server (its own HOME)."""
    return {
        **os.environ,
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": client.namespace,
        "HOME": str(home),
    }


async def signed_worker_holding_c1(pool: asyncpg.Pool, w: str) -> Callable[[int], dict[str, Any]]:
    """Container ``c-1`` of worker ``w`` in Postgres, and the beats of an agent that signs
    with a key of its own and holds ``c-1``: ``beat(seq)``."""
    await pool.execute(
        "INSERT INTO reaper.containers (handle, worker, state) VALUES ('c-1', $1, 'created')", w
    )
    key = new_private_key()

    def beat(seq: int) -> dict[str, Any]:
        return sign_heartbeat(
            {"worker": w, "boot_id": "b-1", "seq": seq, "containers": ["c-1"]}, key
        )

    return beat


ARITY = {
    "WorkerLiveness": ["heartbeat", "force_reap", "drain", "gc_status", "want_report", "labels"],
    "HandleCollector": ["report", "labels", "heartbeat"],
    "FleetMonitor": ["heartbeat", "labels"],
}
"""Signal names sent to each workflow type: known ones and ones it does not know."""


async def test_several_inputs_through_the_temporal_cli_wedge_nothing(
    dev_env: WorkflowEnvironment, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """``temporal workflow signal`` with 0 to 5 ``--input`` of arbitrary JSON, on the
    liveness, its collector and the fleet monitor, and ``temporal workflow start`` of a reap
    with several: no task fails, no row changes, the next ordinary beat is applied."""
    client, tq = dev_env.client, f"tq-arity-{uuid.uuid4().hex[:8]}"
    w = f"arity-{uuid.uuid4().hex[:8]}"
    env = cli_env(client, tmp_path)
    beat = await signed_worker_holding_c1(pool, w)

    inputs: list[list[str]] = []

    @settings(
        max_examples=8,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(junk.map(json.dumps), max_size=5))
    def collect(texts: list[str]) -> None:
        inputs.append(texts)

    collect()
    config = make_settings(agent_auth="required", **SLOW)
    async with controller(client, pool, config, tq):
        monitor = (await start_monitor(client, config, tq)).id
        await send(client, tq, beat(0))

        async def processed() -> int:
            try:
                h = client.get_workflow_handle(collector_id(w))
                return await h.query("processed", result_type=int)
            except RPCError:
                return 0  # not started yet

        await eventually(processed, lambda n: n >= 1, what="the collector's first report")
        targets = {
            "WorkerLiveness": liveness_id(w),
            "HandleCollector": collector_id(w),
            "FleetMonitor": monitor,
        }
        sent = 0
        for kind, wid in targets.items():
            for name in ARITY[kind]:
                for texts in inputs:
                    argv = [arg for t in texts for arg in ("--input", t)]
                    await cli(
                        env, "workflow", "signal", "--workflow-id", wid, "--name", name, *argv
                    )
                    sent += 1
        reap = f"reap-arity-{uuid.uuid4().hex[:6]}"
        await cli(
            env,
            "workflow",
            "start",
            "--type",
            "WorkerReap",
            "--task-queue",
            tq,
            "--workflow-id",
            reap,
            "--input",
            json.dumps({"worker": w}),
            "--input",
            "1",
        )
        result = await client.get_workflow_handle(reap).result()
        assert result["refused"] == "malformed input"
        await send(client, tq, beat(1))
        st_ = await eventually(
            lambda: query_state(client, w), lambda s: s.last_seq == 1, what="the agent heard"
        )
        assert (st_.state, st_.missing, st_.draining) == ("running", 0, False)
        assert (
            await pool.fetchval("SELECT missing_since FROM reaper.containers WHERE handle = 'c-1'")
            is None
        )
        for wid in [*targets.values(), reap]:
            assert await failed_tasks(client, wid) == [], wid
        assert sent == sum(len(n) for n in ARITY.values()) * len(inputs)
        await client.get_workflow_handle(monitor).terminate("test over")
