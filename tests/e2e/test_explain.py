"""``reaper explain`` as an operator runs it, against a real controller, dev server and
Postgres: a stalled worker, a missing container and a reaped task are each explained by the
rule that holds them, with the time it next falls due."""

from __future__ import annotations

import json
import uuid
from datetime import datetime

import asyncpg
from temporalio.testing import WorkflowEnvironment

from tests.support.agents import Agents
from tests.support.cli import run_cli
from tests.support.controller import controller, make_settings
from tests.support.heartbeats import beat, query_state, send
from tests.support.polling import eventually
from tests.support.scheduler import insert, setup_service

MARK = "SELECT missing_since FROM reaper.containers WHERE handle = $1"
TIMINGS = dict(heartbeat_interval=1, stall_after=3, lost_after=60, missing_ttl=30)


def env_of(dev_env: WorkflowEnvironment) -> dict[str, str]:
    return {
        "REAPER_TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
        **{f"REAPER_{k.upper()}": str(v) for k, v in TIMINGS.items()},
    }


async def explain(env: dict[str, str], db_url: str, *args: str) -> dict:
    out = await run_cli("explain", *args, "--json", "--database-url", db_url, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def test_explain_a_stalled_worker_a_missing_container_and_a_reaped_task(
    dev_env: WorkflowEnvironment, pool: asyncpg.Pool, db_url: str
) -> None:
    client, tq = dev_env.client, f"tq-explain-{uuid.uuid4().hex[:8]}"
    s, w, r = (f"{n}-{uuid.uuid4().hex[:6]}" for n in ("s", "w", "r"))
    env = env_of(dev_env)
    env["REAPER_TASK_QUEUE"] = tq
    await insert(pool, "containers", w, ["c-1", "c-2"])
    await setup_service(pool, "svc", {r: ["t-1"]})
    # t-s runs on s, which falls silent; t-p is placed on w, whose agent never starts it
    # (as with a missing template: w's beats carry no tasks).
    await setup_service(pool, "other", {w: ["t-p"]})
    await pool.execute(
        "INSERT INTO reaper.tasks (id, service, worker, state) VALUES ('t-s', 'other', $1,"
        " 'running')",
        s,
    )
    async with controller(client, pool, make_settings(**TIMINGS), tq):
        await send(client, tq, beat(s, 0))
        await send(client, tq, beat(w, 0, containers=["c-1"]))
        for seq in (0, 1):
            await send(client, tq, beat(r, seq, tasks=["t-1"]))
        await eventually(
            lambda: pool.fetchval(
                "SELECT missing_since FROM reaper.containers WHERE handle = 'c-2'"
            ),
            lambda m: m is not None,
            what="c-2 marked missing",
        )
        await eventually(
            lambda: pool.fetchval("SELECT state FROM reaper.tasks WHERE id = 't-1'"),
            lambda st: st == "running",
            what="t-1 running",
        )
        await client.get_workflow_handle(f"liveness-{r}").signal(
            "force_reap", {"reason": "host r is being rebuilt", "actor": "ops"}
        )
        await eventually(
            lambda: query_state(client, s), lambda v: v.state == "stalled", what="s stalled"
        )
        await eventually(
            lambda: pool.fetchval("SELECT state FROM reaper.tasks WHERE id = 't-1'"),
            lambda st: st == "lost",
            what="t-1 reaped",
        )

        stalled = await explain(env, db_url, "worker", s)
        assert stalled["state"] == "stalled" and stalled["next"].startswith("lost at")
        lost_at = datetime.fromisoformat(stalled["due_at"])
        last = (await query_state(client, s)).last_heartbeat_at
        assert last is not None and (lost_at - last).total_seconds() == 60

        missing = await explain(env, db_url, "container", "c-2")
        assert missing["because"].startswith("missing since")
        assert missing["next"].startswith("destroyed at")
        marked = await pool.fetchval(
            "SELECT missing_since FROM reaper.containers WHERE handle = 'c-2'"
        )
        assert (datetime.fromisoformat(missing["due_at"]) - marked).total_seconds() == 30

        reaped = await explain(env, db_url, "task", "t-1")
        assert reaped["state"] == "lost" and "(worker-lost)" in reaped["because"]
        assert any(n.startswith("replaced by svc-") for n in reaped["notes"])
        assert any("lost: host r is being rebuilt" in line for line in reaped["history"])

        # Without KIND (issue 35): the kind that holds the name.
        plain = await explain(env, db_url, "c-2")
        same = ("subject", "state", "because", "next", "due_at")  # notes follow w's state
        assert {k: plain[k] for k in same} == {k: missing[k] for k in same}
        out = await run_cli("explain", "nothing-here", "--database-url", db_url, env=env)
        assert out.returncode == 1 and "nothing is named 'nothing-here'" in out.stderr, out

        # A task of the stalled worker: reaped with it, when the worker is lost.
        held = await explain(env, db_url, "t-s")
        assert held["state"] == "running" and held["because"].startswith(f"running on {s},")
        assert held["next"].startswith(f"reaped (lost) and replaced when {s} is lost, at ")
        assert held["due_at"] == stalled["due_at"]

        # A task its running worker never starts: pending, and reaper will not move it. (w
        # beats on meanwhile, its reports without tasks: as an agent with no template.)
        with Agents(client, tq) as agents:
            agents.reports = {w: {"containers": ["c-1"]}}
            await eventually(
                lambda: pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", w),
                lambda st: st == "running",
                timeout=30,
                what="w's row running again",
            )
            pending = await explain(env, db_url, "task", "t-p")
        assert pending["state"] == "pending" and pending["because"].startswith(f"placed on {w}")
        assert any("never will" in n for n in pending["notes"]), pending

        # The plain form, as an operator reads it (printed for the record).
        for args in (("worker", s), ("c-2",), ("task", "t-1"), ("t-s",), ("t-p",)):
            out = await run_cli("explain", *args, "--database-url", db_url, env=env)
            assert out.returncode == 0, out.stderr
            print(out.stdout)


CTL = dict(heartbeat_interval=2.0, stall_after=8, lost_after=16, missing_ttl=30)
"""The controller's timings in the test below; the shell's differ (``SHELL``)."""
SHELL = {"REAPER_STALL_AFTER": "40s", "REAPER_LOST_AFTER": "10m", "REAPER_HEARTBEAT_INTERVAL": "5s"}
BOUND_S = 2 * CTL["heartbeat_interval"] + 1.0
"""CONTRACT.md §5.3: a worker's ``state`` and ``state_since`` show a change within 2 x
HEARTBEAT_INTERVAL; plus the deadline timer's slack and a second of Postgres' clock against
the controller's."""


async def _state_since(pool: asyncpg.Pool, worker: str, state: str) -> datetime:
    row = await eventually(
        lambda: pool.fetchrow(
            "SELECT state, state_since FROM reaper.workers WHERE name = $1", worker
        ),
        lambda r: r is not None and r["state"] == state,
        timeout=60,
        what=f"{worker} {state}",
    )
    return row["state_since"]


async def test_explain_predicts_the_controllers_deadline_through_an_outage_grace(
    dev_env: WorkflowEnvironment, pool: asyncpg.Pool, db_url: str
) -> None:
    """``reaper explain`` judges with the controller's timings, not the shell's (which say
    STALL_AFTER 40 s here), and with its outage grace: each due time it gives comes true
    within the time rule's bound. The worker stalls on time; the controller is then down
    across its LOST_AFTER, looks at it late and grants a grace (STALL_AFTER from that look);
    explain then says lost at the grace's end, and so it is."""
    from datetime import timedelta

    client, tq = dev_env.client, f"tq-due-{uuid.uuid4().hex[:8]}"
    w = f"due-{uuid.uuid4().hex[:6]}"
    env = {"REAPER_TEMPORAL_ADDRESS": client.service_client.config.target_host, **SHELL}
    env["REAPER_TASK_QUEUE"] = tq
    settings = make_settings(**CTL)
    options = {"sticky_queue_schedule_to_start_timeout": timedelta(seconds=1)}
    async with controller(client, pool, settings, tq, **options):
        for seq in (0, 1):
            await send(client, tq, beat(w, seq))
        await eventually(lambda: query_state(client, w), lambda v: v.last_seq == 1, what="beat")
        running = await explain(env, db_url, "worker", w)
        assert running["timings"].startswith("the controller's"), running
        assert running["next"].startswith("stalled at"), running
        stall_due = datetime.fromisoformat(running["due_at"])
        last = (await query_state(client, w)).last_heartbeat_at
        assert last is not None and (stall_due - last).total_seconds() == CTL["stall_after"]
        stalled_at = await _state_since(pool, w, "stalled")
        assert 0 <= (stalled_at - stall_due).total_seconds() <= BOUND_S, (stalled_at, stall_due)
    # Down across its LOST_AFTER: the deadline (last + 16 s) is looked at late.
    lost_due = last + timedelta(seconds=CTL["lost_after"])
    await eventually(
        lambda: pool.fetchval("SELECT now()"),
        lambda now: now > lost_due + timedelta(seconds=2 * CTL["heartbeat_interval"]),
        timeout=60,
        poll=0.5,
        what="past the lost deadline by more than a heartbeat interval",
    )
    async with controller(client, pool, settings, tq, **options):
        graced = await eventually(
            lambda: explain(env, db_url, "worker", w),
            lambda out: any("outage grace until" in n for n in out["notes"]),
            timeout=30,
            poll=0.5,
            what="the late look's grace",
        )
        assert graced["state"] == "stalled" and graced["next"].startswith("lost at"), graced
        grace_end = datetime.fromisoformat(graced["due_at"])
        assert grace_end > lost_due + timedelta(seconds=CTL["heartbeat_interval"]), graced
        lost_at = await _state_since(pool, w, "lost")
        assert 0 <= (lost_at - grace_end).total_seconds() <= BOUND_S, (lost_at, grace_end)
