"""The controller's log, from a real ``python worker.py`` whose standard error is a file: one
JSON object per line, one line per ``events`` row written (state changes, destroys, reaps,
replacements) and per rejected message, each with its worker, handle, reason and workflow id
(issue 10, item 3)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg

from tests.support.agents import Agents
from tests.support.controller import ControllerProcess
from tests.support.heartbeats import beat, send
from tests.support.polling import eventually

FAST = {
    "REAPER_HEARTBEAT_INTERVAL": "1s",
    "REAPER_STALL_AFTER": "2s",
    "REAPER_LOST_AFTER": "5s",
    "REAPER_MISSING_TTL": "3s",
    "REAPER_RESYNC_INTERVAL": "1s",
}


def log_lines(proc: ControllerProcess) -> list[dict[str, Any]]:
    """Every line of the controller's log, each parsed as the JSON object it must be."""
    text = proc.log.read_text(errors="replace") if proc.log.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def events(pool: asyncpg.Pool, action: str) -> int:
    return await pool.fetchval("SELECT count(*) FROM reaper.events WHERE action = $1", action)


def key(line: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies an events row, and its log line."""
    return line["worker"], line["kind"], line.get("handle"), line["action"]


async def test_one_json_line_per_event_and_rejection(dev_env, pool, db_url, tmp_path):
    client = dev_env.client
    sfx = uuid.uuid4().hex[:6]
    a, c = f"log-a-{sfx}", f"log-c-{sfx}"
    await pool.execute("INSERT INTO reaper.services (name, desired_count) VALUES ('web', 2)")
    await pool.execute(
        "INSERT INTO reaper.tasks (id, service, worker, state) VALUES"
        " ('t-a', 'web', $1, 'running'), ('t-c', 'web', $2, 'running')",
        a,
        c,
    )
    await pool.execute(
        "INSERT INTO reaper.volumes (handle, worker) VALUES ('v-1', $1), ('v-2', $1)", a
    )
    proc = ControllerProcess(
        client.service_client.config.target_host, db_url, tmp_path / "c.log", FAST
    )
    proc.start()
    try:
        with Agents(client, proc.task_queue) as agents:
            agents.reports = {a: {"volumes": ["v-1"], "tasks": ["t-a"]}, c: {"tasks": ["t-c"]}}
            await eventually(
                lambda: pool.fetchval(
                    "SELECT count(*) FROM reaper.events WHERE action = 'destroyed'"
                ),
                lambda n: n == 1,
                timeout=60,
                poll=0.2,
                what=f"v-2 destroyed\n{proc.tail()}",
            )
            await send(client, proc.task_queue, beat(f"intruder-{sfx}", 1), worker=a)
            del agents.reports[c]  # c falls silent: stalled, lost, t-c reaped and replaced
            await eventually(
                lambda: pool.fetchval(
                    "SELECT count(*) FROM reaper.events WHERE action = 'replaced'"
                ),
                lambda n: n == 1,
                timeout=60,
                poll=0.2,
                what=f"t-c replaced\n{proc.tail()}",
            )
            rejected = await eventually(
                lambda: _rejections(proc),
                lambda lines: len(lines) == 1,
                timeout=30,
                poll=0.2,
                what="the intruder's beat logged as rejected",
            )
    finally:
        proc.stop()

    [line] = rejected
    assert line["worker"] == a and line["workflow_id"] == f"liveness-{a}", line
    assert f"intruder-{sfx}" in line["reason"] and line["level"] == "warning", line

    rows = await pool.fetch(
        "SELECT worker, kind, handle, action, reason FROM reaper.events"
        " WHERE worker IN ($1, $2) ORDER BY id",
        a,
        c,
    )
    logged = [ln for ln in log_lines(proc) if ln["logger"] == "reaper.events" and "worker" in ln]
    assert sorted(map(key, logged)) == sorted(key(dict(r)) for r in rows), (logged, rows)
    actions = {r["action"] for r in rows}
    assert {"state", "destroyed", "lost", "replaced"} <= actions, actions
    for ln in logged:
        assert ln["reason"] and ln["workflow_id"], ln
    [destroyed] = [ln for ln in logged if ln["action"] == "destroyed"]
    assert (destroyed["handle"], destroyed["workflow_id"]) == ("v-2", f"gc-{a}"), destroyed
    [lost] = [ln for ln in logged if ln["action"] == "lost"]
    assert lost["handle"] == "t-c" and lost["worker"] == c, lost
    states = [ln for ln in logged if ln["action"] == "state" and ln["worker"] == c]
    assert [s["reason"].split(":")[0] for s in states] == [
        "new -> running",
        "running -> stalled",
        "stalled -> lost",
    ], states
    assert all(s["workflow_id"].startswith(f"liveness-{c}") for s in states), states


async def _rejections(proc: ControllerProcess) -> list[dict[str, Any]]:
    return [ln for ln in log_lines(proc) if ln.get("action") == "rejected"]
