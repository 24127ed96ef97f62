"""``reaper events``, ``reaper try-scheduler`` and every command's help, run as real
processes against a real Postgres (rows written by the controller's own events writer)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from activities.base import write_events
from reaper.cli import read
from reaper.cli.follow import GAP_WAIT_S, FollowWindow
from reaper.core.contract import StateView
from tests.support.cli import reaper as run_reaper
from tests.support.controller import controller, make_settings
from tests.support.heartbeats import beat, beats_handled, query_state, send
from tests.support.polling import eventually


def address(env: WorkflowEnvironment) -> str:
    return env.client.service_client.config.target_host


COMMANDS = [
    "",
    "run",
    "agent",
    "workers",
    "events",
    "try-scheduler",
    "reset",
    "explain",
    "drain",
    "undrain",
    "retire",
    "force-reap",
    "keygen",
    "demo",
]


def reaper(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``reaper ARGS`` in a fresh process at 80 columns (``tests.support.cli.reaper``)."""
    return run_reaper(*args, env={"COLUMNS": "80"}, timeout=timeout)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_renders_at_80_columns_without_types_or_cut_words(command: str) -> None:
    out = reaper(*([command] if command else []), "--help")
    assert out.returncode == 0, out
    text = out.stdout
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("Usage:"))
    assert "<bool>" not in text and "…" not in text and "..." not in body, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    # Every option's help is a sentence: it ends with a full stop (or a [default]/[required]).
    helps = re.findall(r"^  (?:-\w, )?--[\w-]+.*?(?=^  -|\Z)", text, flags=re.M | re.S)
    assert helps, text
    for entry in helps:
        body = " ".join(entry.split())
        assert re.search(r"[.)]\s*(\[[^\]]+\]\s*)*$", body), f"not a sentence: {body!r}"
    if command in ("drain", "undrain", "retire", "force-reap"):
        assert "$USER, or operator if $USER is unset" in " ".join(text.split())


def test_errors_are_one_line() -> None:
    for args, code in (
        (["events", "--bogus"], 2),
        (["drain"], 2),
        (["events", "--since", "yesterday"], 2),
        (["events", "--database-url", "postgresql://reaper@127.0.0.1:1/none"], 1),
        (["try-scheduler", "--database-url", "postgresql://reaper@127.0.0.1:1/none"], 1),
    ):
        out = reaper(*args)
        assert out.returncode == code, out
        assert out.stderr.startswith("reaper: ") and out.stderr.count("\n") == 1, out.stderr
        assert "Traceback" not in out.stderr


async def _events(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await write_events(conn, "w1", "container", "destroyed", ["c-1"], "missing")
        await write_events(conn, "w1", "worker", "state", ["w1"], "running -> stalled")
        await write_events(conn, "w2", "task", "lost", ["t-1"], "disk failed", "alice")
        await write_events(conn, "w2", "task", "replaced", ["t-2"], "replaces t-1", "reaper")


def _json_rows(out: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    assert out.returncode == 0, out
    return [json.loads(line) for line in out.stdout.splitlines()]


async def test_events_filters_and_json(pool: asyncpg.Pool, db_url: str) -> None:
    await _events(pool)
    run = lambda *a: asyncio.to_thread(reaper, "events", "--database-url", db_url, *a)  # noqa: E731

    rows = _json_rows(await run("--json"))
    assert [(r["worker"], r["action"], r["handle"]) for r in rows] == [
        ("w1", "destroyed", "c-1"),
        ("w1", "state", "w1"),
        ("w2", "lost", "t-1"),
        ("w2", "replaced", "t-2"),
    ]
    assert set(rows[0]) == {"id", "at", "worker", "kind", "handle", "action", "reason", "actor"}
    assert rows[2]["actor"] == "alice" and rows[2]["reason"] == "disk failed"

    assert [r["handle"] for r in _json_rows(await run("--json", "--worker", "w2"))] == [
        "t-1",
        "t-2",
    ]
    assert [r["handle"] for r in _json_rows(await run("--json", "--kind", "task"))] == [
        "t-1",
        "t-2",
    ]
    assert [r["handle"] for r in _json_rows(await run("--json", "--action", "state"))] == ["w1"]
    assert [r["handle"] for r in _json_rows(await run("--json", "--limit", "1"))] == ["t-2"]
    assert len(_json_rows(await run("--json", "--since", "10m"))) == 4
    assert _json_rows(await run("--json", "--until", "10m")) == []
    assert len(_json_rows(await run("--json", "--since", "2000-01-01T00:00:00Z"))) == 4

    out = await run()
    assert out.returncode == 0, out
    lines = out.stdout.splitlines()
    assert len(lines) == 4 and "w2" in lines[2] and "lost" in lines[2] and "alice" in lines[2]
    # Times say UTC, as every table's do (issue 35); "(by ...)" only where someone other
    # than the controller acted: none on its own rows, whether their actor is reaper or none.
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC  "
    assert all(re.match(stamp, ln) for ln in lines), lines
    assert "(by alice)" in lines[2]
    assert not [ln for ln in lines if "(by reaper)" in ln or ("(by" in ln and ln != lines[2])]


async def test_events_follow_prints_new_rows_and_ends_on_ctrl_c(
    pool: asyncpg.Pool, db_url: str
) -> None:
    await _events(pool)
    async with pool.acquire() as conn, conn.transaction():
        await write_events(conn, "w3", "worker", "state", ["w3"], "new -> running")
    env = {k: v for k, v in os.environ.items() if not k.startswith("REAPER_")}
    argv = ["events", "--database-url", db_url, "--follow", "--json", "--worker", "w3"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "reaper.cli", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent,
    )
    assert proc.stdout is not None

    async def next_row() -> dict[str, object]:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=20)
        row: dict[str, object] = json.loads(line)
        return row

    try:
        first = await next_row()  # the rows so far: it is up and following now
        assert (first["worker"], first["action"]) == ("w3", "state")
        async with pool.acquire() as conn, conn.transaction():
            await write_events(conn, "w2", "volume", "destroyed", ["v-9"], "missing")
            await write_events(conn, "w3", "container", "orphan", ["stray"], "unknown")
        start = time.monotonic()
        seen = await next_row()
        assert (seen["worker"], seen["action"], seen["handle"]) == ("w3", "orphan", "stray")
        assert time.monotonic() - start < 20
        proc.send_signal(signal.SIGINT)
        assert await asyncio.to_thread(proc.wait, 15) == 0
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_try_scheduler_places_a_service_as_a_scheduler_would(
    pool: asyncpg.Pool, db_url: str, tmp_path: Path
) -> None:
    await pool.execute(
        "INSERT INTO reaper.workers (name, state, draining) VALUES"
        " ('a1', 'running', false), ('a2', 'running', false), ('a3', 'running', true),"
        " ('a4', 'lost', false)"
    )
    args = ("try-scheduler", "--database-url", db_url, "--count", "3")
    out = await asyncio.to_thread(reaper, *args, "--agents-dir", str(tmp_path))
    assert out.returncode == 0, out
    assert "stand-in" in reaper("try-scheduler", "--help").stdout
    assert await pool.fetchval("SELECT desired_count FROM reaper.services WHERE name = 'web'") == 3
    tasks = await pool.fetch("SELECT id, worker, state FROM reaper.tasks ORDER BY id")
    assert [tuple(r.values()) for r in tasks] == [
        ("web-1", "a1", "pending"),
        ("web-2", "a2", "pending"),
        ("web-3", "a1", "pending"),
    ]
    for table, suffix in (("containers", "c"), ("volumes", "v")):
        rows = await pool.fetch(f"SELECT handle, worker, state FROM reaper.{table} ORDER BY 1")
        assert [tuple(r.values()) for r in rows] == [
            (f"web-{i}-{suffix}", w, "created") for i, w in ((1, "a1"), (2, "a2"), (3, "a1"))
        ]
        for i, w in ((1, "a1"), (2, "a2"), (3, "a1")):
            assert (tmp_path / w / table / f"web-{i}-{suffix}").exists()
    # It can run again (issue 35): the service is there, with its 3 active tasks: nothing.
    again = await asyncio.to_thread(reaper, *args)
    assert again.returncode == 0, again
    assert "service web exists already (desired_count 3, 3 active tasks): nothing to place" in (
        " ".join(again.stdout.split())
    ), again.stdout
    assert await pool.fetchval("SELECT count(*) FROM reaper.tasks") == 3
    # Once two of its tasks ended (reaper stopped them), it places what falls short, with
    # ids not taken yet; scaled up, one more; scaled down, nothing is stopped.
    await pool.execute(
        "UPDATE reaper.tasks SET state = 'stopped', stop_reason = 'missing'"
        " WHERE id IN ('web-1', 'web-3')"
    )
    out = await asyncio.to_thread(reaper, *args, "--tasks-only")
    assert out.returncode == 0 and "1 active tasks): placed 2 more:" in out.stdout, out
    out = await asyncio.to_thread(reaper, *args[:-1], "4", "--tasks-only")
    assert out.returncode == 0 and "desired_count now 4: placed 1 more:" in out.stdout, out
    tasks = await pool.fetch("SELECT id, state FROM reaper.tasks ORDER BY created_at, id")
    assert [tuple(r.values()) for r in tasks] == [
        ("web-1", "stopped"),
        ("web-2", "pending"),
        ("web-3", "stopped"),
        ("web-4", "pending"),
        ("web-5", "pending"),
        ("web-6", "pending"),
    ]
    out = await asyncio.to_thread(reaper, *args[:-1], "2")
    assert out.returncode == 0 and "desired_count now 2: nothing to place" in out.stdout, out
    assert await pool.fetchval("SELECT desired_count FROM reaper.services") == 2
    assert await pool.fetchval("SELECT count(*) FROM reaper.tasks WHERE state = 'pending'") == 4


async def _state_or_none(client: Client, worker: str) -> StateView | None:
    """The ``state`` query, or ``None`` before the first beat started the liveness."""
    try:
        return await query_state(client, worker)
    except RPCError:
        return None


async def test_an_orphan_shows_in_events_and_workers_once(
    dev_env: WorkflowEnvironment, pool: asyncpg.Pool, db_url: str
) -> None:
    """Through the real controller: a handle the worker keeps reporting, unknown to reaper,
    becomes an orphan after MISSING_TTL: one ``orphan`` events row however many reports
    follow, and a count in ``reaper workers --json``."""
    client, tq = dev_env.client, f"tq-{uuid.uuid4().hex[:8]}"
    worker = f"orph-{uuid.uuid4().hex[:6]}"
    timings = dict(heartbeat_interval=0.2, stall_after=5, lost_after=30, missing_ttl=1)
    stop = asyncio.Event()

    async def agent_beats() -> None:  # as an agent that never deletes its orphans
        seq = 0
        while not stop.is_set():
            await send(client, tq, beat(worker, seq, containers=["stray"], volumes=[], tasks=[]))
            seq += 1
            try:
                await asyncio.wait_for(stop.wait(), timings["heartbeat_interval"])
            except TimeoutError:
                pass

    async with controller(client, pool, make_settings(**timings, resync_interval=0.4), tq):
        beats = asyncio.create_task(agent_beats())
        try:
            await eventually(
                lambda: _state_or_none(client, worker),
                lambda v: v is not None and v.orphans == ["stray"],
                timeout=30,
                what="stray listed as an orphan",
            )

            async def listed() -> list[dict[str, Any]]:
                out = await asyncio.to_thread(
                    reaper,
                    *("workers", "--json", "--address", address(dev_env)),
                    *("--database-url", db_url),
                )
                assert out.returncode == 0, out
                return [r for r in json.loads(out.stdout)["workers"] if r["worker"] == worker]

            # A row whose query found the liveness busy has only {"worker", "error"}, and the
            # listing (Temporal's visibility) may miss a liveness for a moment: ask again.
            [row] = await eventually(
                listed,
                lambda rows: len(rows) == 1 and "error" not in rows[0],
                what="the worker listed",
            )
            assert row["orphans"] == 1
            await beats_handled(client, worker, 15)  # many more reports of the same orphan
        finally:
            stop.set()
            await beats
    rows = await pool.fetch(
        "SELECT kind, handle, action FROM reaper.events WHERE worker = $1 AND action = 'orphan'",
        worker,
    )
    assert [tuple(r.values()) for r in rows] == [("container", "stray", "orphan")]
    out = await asyncio.to_thread(
        reaper, "events", "--database-url", db_url, "--worker", worker, "--action", "orphan"
    )
    assert out.returncode == 0 and "orphan stray" in out.stdout, out


def test_the_follow_window_prints_each_row_once_and_waits_for_a_gap():
    """Ids commit out of order (a reap held on a lock commits 11 after 12 was printed): the
    floor stays below 11 until it commits, so 11 is printed then; a gap that never fills
    (a rolled-back id) is given up after GAP_WAIT_S."""
    w = FollowWindow(10)
    assert w.fresh([12]) == [12]
    w.advance([12], now=0.0)
    assert w.floor == 10  # 11 is awaited
    assert w.fresh([11, 12]) == [11]  # 12 is not printed again
    w.advance([11, 12], now=1.0)
    assert w.floor == 12 and not w.printed
    w.advance([14], now=2.0)  # 13 rolled back
    assert w.floor == 12
    w.advance([], now=2.0 + GAP_WAIT_S)
    assert w.floor == 14


async def test_follow_prints_a_row_whose_transaction_committed_after_a_newer_one(pool):
    """Against Postgres: the row of a transaction that drew its id first and committed last
    is read above the floor and printed once."""
    w = FollowWindow(await pool.fetchval("SELECT coalesce(max(id), 0) FROM reaper.events"))
    insert = (
        "INSERT INTO reaper.events (kind, action, handle) VALUES ('task', 'lost', $1) RETURNING id"
    )
    async with pool.acquire() as slow:
        tx = slow.transaction()
        await tx.start()
        first = await slow.fetchval(insert, "t-slow")
        second = await pool.fetchval(insert, "t-fast")
        assert second > first
        printed = []
        for _ in range(2):
            committed = await read.event_ids_after(pool, w.floor)
            rows = await read.events(pool, after_id=w.floor)
            printed += w.fresh(r.id for r in rows)
            w.advance(committed, time.monotonic())
            if first not in printed:
                await tx.commit()
        assert printed == [second, first]
