"""The worked example of docs/agent-protocol.md, run as written with the real `temporal` CLI.

The shell block that follows the ``worked-example`` marker in the guide is extracted and run
with bash against the session's dev server and an in-process controller (its own task queue
and worker name, passed in the variables the block declares), so the guide cannot rot: the
heartbeats must be accepted, the worker must be ``running`` in the liveness and in Postgres,
and the block's own ``state`` query must answer with what it sent.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

import asyncpg
from temporalio.testing import WorkflowEnvironment

from tests.support.controller import controller, find_binary, make_settings
from tests.support.heartbeats import query_state
from tests.support.paths import ROOT
from tests.support.polling import eventually

GUIDE = ROOT / "docs" / "agent-protocol.md"
MARKER = "<!-- worked-example: run by tests/e2e/test_agent_protocol_doc.py -->"
FAST = dict(heartbeat_interval=1, stall_after=30, lost_after=60, missing_ttl=30, resync_interval=1)
"""Nothing goes stalled while the example runs."""


def worked_example() -> str:
    """The shell block right after the marker."""
    text = GUIDE.read_text(encoding="utf-8")
    assert text.count(MARKER) == 1, "exactly one worked example"
    after = text.split(MARKER, 1)[1]
    match = re.match(r"\s*```sh\n(.*?)\n```", after, re.DOTALL)
    assert match, "the marker is followed by a ```sh block"
    return match.group(1)


def last_json(stdout: str) -> Any:
    """The last top-level JSON object printed (the block ends with the query)."""
    start = stdout.rfind("\n{")
    return json.loads(stdout[start + 1 if start >= 0 else stdout.index("{") :])


def test_the_example_uses_only_the_contract_names() -> None:
    block = worked_example()
    assert "temporal workflow signal-with-start" in block
    assert '--workflow-id "liveness-$WORKER" --type WorkerLiveness' in block
    assert "--signal-name heartbeat" in block and "--type state" in block
    assert "python3 -c 'import uuid" in block, "a fresh boot_id per start"


async def test_worked_example_heartbeats_with_the_temporal_cli(
    dev_env: WorkflowEnvironment, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    client, tq = dev_env.client, f"tq-doc-{uuid.uuid4().hex[:8]}"
    worker = f"doc-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PATH": f"{Path(find_binary('temporal')).parent}{os.pathsep}{os.environ['PATH']}",
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": client.namespace,
        "REAPER_TASK_QUEUE": tq,
        "WORKER": worker,
        "HOME": str(tmp_path),  # the CLI may look for a config file there
    }
    async with controller(client, pool, make_settings(**FAST), tq):
        proc = await asyncio.create_subprocess_exec(
            "bash",
            "-euo",
            "pipefail",
            "-c",
            worked_example(),
            env=env,
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        stdout, stderr = out.decode(), err.decode()
        assert proc.returncode == 0, f"exit {proc.returncode}\n{stdout}\n{stderr}"

        # The block's own query answered with what it sent.
        answer = last_json(stdout)
        [view] = answer.get("queryResult", [answer])
        assert view["worker"] == worker and view["state"] == "running", view
        # A query that races the last signal may answer from the workflow task before it
        # (the doc says so): seq 1 or 2, never anything else.
        assert view["last_seq"] in (1, 2) and view["boot_id"], view
        # The CLI prints the workflow's empty lists as null (a Go nil slice): none either way.
        assert not view["assignments"] and not view["orphans"] and view["rejected"] == 0, view

        # The controller holds the worker as running, and Postgres shows it.
        state = await eventually(
            lambda: query_state(client, worker), lambda s: s.last_seq == 2, what="seq 2 applied"
        )
        assert (state.state, state.last_seq, state.ignored) == ("running", 2, 0)
        assert (state.assignments, state.orphans) == ([], [])
        assert state.report_digests.keys() >= {"containers", "volumes", "tasks"}
        await eventually(
            lambda: pool.fetchrow(
                "SELECT state, boot_id FROM reaper.workers WHERE name = $1", worker
            ),
            lambda row: row is not None and row["state"] == "running",
            what=f"{worker} running in reaper.workers",
        )
