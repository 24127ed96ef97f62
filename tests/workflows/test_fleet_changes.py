"""A fleet that changes (CONTRACT.md §5.1, §5.3): retire, undrain, owed work, strays, churn.

Time-skipping server. Timings: heartbeat 10 s, stalled after 30 s, lost after 300 s, missing
TTL 300 s, disruption threshold 0.55; RETIRE_AFTER as each test says.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import asyncpg
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from reaper.core.contract import liveness_id
from tests.support.controller import controller, make_settings
from tests.support.fleet import Fleet, fleet_with
from tests.support.polling import eventually
from tests.support.scheduler import insert, setup_service, task_states
from tests.support.upgrade import replay_failures, sequence
from workflows.common import STATE_ATTR

LOST = 300
HB = 10


async def signal(fleet: Fleet, worker: str, name: str, reason: str) -> None:
    """An operator's signal to a worker's liveness."""
    handle = fleet.client.get_workflow_handle(liveness_id(worker))
    await handle.signal(name, {"reason": reason, "actor": "ops"})


async def worker_row(pool: asyncpg.Pool, worker: str) -> asyncpg.Record:
    return await pool.fetchrow(
        "SELECT state, draining, boot_id, state_since FROM reaper.workers WHERE name = $1", worker
    )


async def events(pool: asyncpg.Pool, worker: str, action: str) -> list[tuple[Any, ...]]:
    rows = await pool.fetch(
        "SELECT kind, handle, reason, actor FROM reaper.events WHERE worker = $1 AND action = $2"
        " ORDER BY id",
        worker,
        action,
    )
    return [tuple(r) for r in rows]


async def test_retire_reaps_and_replaces_at_once_and_destroys_handle_rows(fleet):
    a, b = fleet.name("a"), fleet.name("b")
    await setup_service(fleet.pool, "web", {a: ["t-a"], b: ["t-b"]})
    await insert(fleet.pool, "containers", a, ["c-a"])
    await insert(fleet.pool, "volumes", a, ["v-a"])
    await fleet.beat(a, tasks=["t-a"], containers=["c-a"], volumes=["v-a"])
    await fleet.beat(b, tasks=["t-b"])
    await signal(fleet, a, "retire", "scale-in")
    await fleet.retired(a)  # no timer: at once, no LOST_AFTER wait
    tasks = await task_states(fleet.pool)
    assert tasks["t-a"][1:3] == ("lost", "worker-retired")
    replacement = await fleet.pool.fetchrow(
        "SELECT id, worker, state FROM reaper.tasks WHERE replaces = 't-a'"
    )
    assert (replacement["worker"], replacement["state"]) == (b, "pending")
    assert (
        await fleet.pool.fetchval("SELECT count(*) FROM reaper.containers WHERE worker = $1", a)
        == 0
    )
    assert (
        await fleet.pool.fetchval("SELECT count(*) FROM reaper.volumes WHERE worker = $1", a) == 0
    )
    destroyed = await events(fleet.pool, a, "destroyed")
    assert [(k, h) for k, h, _, _ in destroyed] == [("container", "c-a"), ("volume", "v-a")]
    assert all(reason == "retired: scale-in" for _, _, reason, _ in destroyed)
    states = await events(fleet.pool, a, "state")
    assert states[-1][2] == "running -> retired: scale-in" and states[-1][3] == "ops"
    desc = await fleet.client.get_workflow_handle(liveness_id(a)).describe()
    assert desc.typed_search_attributes.get(STATE_ATTR) == "retired"


async def test_retired_boot_is_ignored_and_a_new_boot_registers_afresh(fleet):
    a, b = fleet.name("a"), fleet.name("b")
    await fleet.beat(a, containers=[])
    await fleet.beat(b)
    await signal(fleet, a, "drain", "about to go")
    await signal(fleet, a, "retire", "decommission")
    await fleet.retired(a)
    # A beat still in flight from the retired boot: a run starts, reads the row, ends.
    await fleet.beat(a, containers=["c-late"])
    row = await worker_row(fleet.pool, a)
    assert row["state"] == "retired"
    assert (
        await fleet.pool.fetchval(
            "SELECT count(*) FROM reaper.unknown_handles WHERE worker = $1", a
        )
        == 0
    )
    # The host comes back reinstalled: a new boot id registers it afresh.
    new_boot = fleet.reboot(a)
    await fleet.beat(a, containers=[])
    await eventually(
        lambda: worker_row(fleet.pool, a),
        lambda r: r["state"] == "running" and r["boot_id"] == new_boot,
        what=f"{a} registered afresh",
    )
    row = await worker_row(fleet.pool, a)
    assert row["draining"] is False
    assert (await fleet.state(a)).state == "running"


async def test_a_retire_delivered_after_the_host_restarted_does_not_retire_the_new_boot(fleet):
    a = fleet.name("a")
    await fleet.beat(a, containers=[])
    old_boot = fleet.boot[a]
    fleet.reboot(a)  # the host restarts; its old agent's retire is still on its way
    await fleet.beat(a, containers=[])
    handle = fleet.client.get_workflow_handle(liveness_id(a))
    before = (await fleet.state(a)).ignored
    await handle.signal("retire", {"reason": "shutdown", "actor": "agent", "boot_id": old_boot})
    await eventually(lambda: fleet.state(a), lambda s: s.ignored > before, what="retire seen")
    await fleet.advance(HB, beating={a: {"containers": []}})
    assert (await worker_row(fleet.pool, a))["state"] == "running"
    # The same agent's retire for the boot it runs acts.
    await handle.signal(
        "retire", {"reason": "shutdown", "actor": "agent", "boot_id": fleet.boot[a]}
    )
    await fleet.retired(a)


async def test_retired_workers_count_neither_way_in_rule_6(fleet):
    a, b, c = fleet.name("a"), fleet.name("b"), fleet.name("c")
    for w in (a, b, c):
        await fleet.beat(w)
    await signal(fleet, a, "retire", "scale-in")
    await fleet.retired(a)
    await signal(fleet, b, "retire", "scale-in")
    await fleet.retired(b)
    # One running worker, two retired: the fleet is normal, not 2/3 unhealthy.
    fleet_row = await fleet.pool.fetchrow("SELECT state FROM reaper.fleet WHERE id = 1")
    assert fleet_row["state"] == "normal"


async def test_retire_of_a_retired_worker_changes_nothing(fleet):
    a, b = fleet.name("a"), fleet.name("b")
    await fleet.beat(a)
    await fleet.beat(b)
    await signal(fleet, a, "retire", "first")
    await fleet.retired(a)
    before = await fleet.pool.fetchval("SELECT count(*) FROM reaper.events")
    await fleet.beat(a)  # a new run for the retired boot, which ends at once
    try:
        await signal(fleet, a, "retire", "second")
    except Exception:
        pass  # the run may have ended already: nobody to signal
    await fleet.beat(b)
    assert await fleet.pool.fetchval("SELECT count(*) FROM reaper.events") == before
    assert (await worker_row(fleet.pool, a))["state"] == "retired"


async def test_lost_worker_retired_automatically_after_retire_after(time_env, pool):
    async with fleet_with(time_env, pool, retire_after=600) as fleet:
        a, b, c = fleet.name("a"), fleet.name("b"), fleet.name("c")
        await insert(fleet.pool, "volumes", a, ["v-a"])
        await fleet.beat(a, volumes=["v-a"])
        live: dict[str, dict[str, Any]] = {b: {}, c: {}}
        for w in live:
            await fleet.beat(w)
        await fleet.advance(LOST + 2 * HB, beating=live)
        assert (await worker_row(fleet.pool, a))["state"] == "lost"
        await fleet.advance(500, beating=live)
        assert (await worker_row(fleet.pool, a))["state"] == "lost", "retired before RETIRE_AFTER"
        await fleet.advance(120, beating=live)
        await fleet.retired(a)
        assert (
            await fleet.pool.fetchval("SELECT count(*) FROM reaper.volumes WHERE worker = $1", a)
            == 0
        )
        states = await events(fleet.pool, a, "state")
        assert states[-1][2] == "lost -> retired: lost for 600s" and states[-1][3] == "reaper"


async def test_undrain_lets_placements_resume(fleet):
    a, b, c = fleet.name("a"), fleet.name("b"), fleet.name("c")
    await setup_service(fleet.pool, "web", {a: ["t-a1"], b: [], c: ["t-c1", "t-c2"]})
    await fleet.beat(a, tasks=["t-a1"])
    await fleet.beat(b, tasks=[])
    await fleet.beat(c, tasks=["t-c1", "t-c2"])
    await signal(fleet, b, "drain", "kernel upgrade")
    await signal(fleet, b, "undrain", "upgrade done")
    await eventually(
        lambda: events(fleet.pool, b, "undrain"), lambda e: len(e) == 1, what="undrain event"
    )
    assert (await worker_row(fleet.pool, b))["draining"] is False
    assert (await events(fleet.pool, b, "undrain"))[0][2:] == ("upgrade done", "ops")
    await signal(fleet, a, "force_reap", "disk failed")
    await eventually(
        lambda: fleet.pool.fetchrow("SELECT worker FROM reaper.tasks WHERE replaces = 't-a1'"),
        lambda r: r is not None,
        what="replacement placed",
    )
    placed = await fleet.pool.fetchval("SELECT worker FROM reaper.tasks WHERE replaces = 't-a1'")
    assert placed == b  # the least loaded, and no longer draining


async def test_drains_and_undrains_that_arrive_together_apply_in_order(time_env, pool):
    """Signals that reach a liveness in one workflow task (here sent while no controller
    serves it; in a clean clone's run, an undrain sent right after a drain on a loaded
    machine) are applied in the order they came: a row for each, ending at the last. The
    newest used to replace the unapplied drain, and the undrain then changed nothing and
    wrote no row (CONTRACT.md §5.1 wants one; ``drain-in-order``). Still one
    ``drain_worker`` activity (``set_draining`` in a 1.1 run)."""
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    settings = make_settings()
    fleet = Fleet(time_env, pool, tq)
    b = fleet.name("b")
    sent = [("drain", "kernel upgrade"), ("undrain", "upgrade done"), ("drain", "disk failing")]
    try:
        # Caching nothing, the first controller leaves no sticky queue for the second.
        async with controller(time_env.client, pool, settings, tq, max_cached_workflows=0):
            await fleet.beat(b, tasks=[])
        for name, reason in sent:
            await signal(fleet, b, name, reason)
        async with controller(time_env.client, pool, settings, tq):
            await eventually(
                lambda: drain_rows(fleet.pool, b),
                lambda r: len(r) == 3,
                what="the rows",
            )
            assert (await worker_row(fleet.pool, b))["draining"] is True
            assert (await fleet.state(b)).state == "running"
            handle = fleet.client.get_workflow_handle(liveness_id(b))
            history = await handle.fetch_history()
    finally:
        await fleet.close()
    rows = [(n, r, "ops") for n, r in sent]
    assert await drain_rows(fleet.pool, b) == rows
    steps = sequence(history)
    assert steps.count("ACTIVITY_TASK_SCHEDULED:drain_worker") == 1, steps
    assert await replay_failures([history]) == {}


async def drain_rows(pool: asyncpg.Pool, worker: str) -> list[tuple[Any, ...]]:
    rows = await pool.fetch(
        "SELECT action, reason, actor FROM reaper.events WHERE worker = $1"
        " AND action IN ('drain', 'undrain') ORDER BY id",
        worker,
    )
    return [tuple(r) for r in rows]


async def owed(pool: asyncpg.Pool, service: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT id, worker, replaces FROM reaper.tasks WHERE service = $1 AND state = 'pending'",
        service,
    )


async def active(pool: asyncpg.Pool, service: str) -> int:
    return await pool.fetchval(
        "SELECT count(*) FROM reaper.tasks WHERE service = $1 AND state IN ('pending', 'running')",
        service,
    )


async def test_owed_replacement_is_placed_when_a_worker_joins(time_env, pool):
    async with fleet_with(time_env, pool, monitor=True) as fleet:
        w1, w2, w3 = fleet.name("w1"), fleet.name("w2"), fleet.name("w3")
        await setup_service(fleet.pool, "api", {w1: ["a1"]})
        await fleet.beat(w1, tasks=["a1"])
        await fleet.beat(w2, tasks=[])
        await signal(fleet, w2, "drain", "kernel upgrade")
        await fleet.advance(LOST + 2 * HB, beating={w2: {"tasks": []}})
        assert (await task_states(fleet.pool))["a1"][1:3] == ("lost", "worker-lost")
        debt = await owed(fleet.pool, "api")
        assert [(r["worker"], r["replaces"]) for r in debt] == [(None, "a1")]  # owed, visible
        assert await active(fleet.pool, "api") == 1
        await fleet.advance(60, beating={w2: {"tasks": []}})
        assert [r["worker"] for r in await owed(fleet.pool, "api")] == [None]
        # A new worker joins: the debt is placed on it within 2 heartbeat intervals.
        await fleet.beat(w3, tasks=[])
        await fleet.advance(2 * HB, beating={w2: {"tasks": []}, w3: {"tasks": []}})
        debt = await owed(fleet.pool, "api")
        assert [(r["worker"], r["replaces"]) for r in debt] == [(w3, "a1")]
        assert await active(fleet.pool, "api") == 1  # never above desired_count
        await fleet.beat(w3, tasks=[])
        await eventually(
            lambda: fleet.state(w3),
            lambda s: s.assignments == [debt[0]["id"]],
            what="owed task assigned to the newcomer",
        )


async def test_stray_task_on_a_lost_and_reaped_worker_is_reaped_and_replaced(time_env, pool):
    async with fleet_with(time_env, pool, monitor=True) as fleet:
        a, b = fleet.name("a"), fleet.name("b")
        await fleet.pool.execute(
            "INSERT INTO reaper.services (name, desired_count) VALUES ('s', 1)"
        )
        await fleet.beat(a, tasks=[])
        await fleet.beat(b, tasks=[])
        await fleet.advance(LOST + 2 * HB, beating={b: {"tasks": []}})
        assert (await worker_row(fleet.pool, a))["state"] == "lost"
        # A scheduler with a stale cache writes a running task onto the lost worker.
        await fleet.pool.execute(
            "INSERT INTO reaper.tasks (id, service, worker, state)"
            " VALUES ('s-1', 's', $1, 'running')",
            a,
        )
        await fleet.advance(2 * HB, beating={b: {"tasks": []}})
        tasks = await task_states(fleet.pool)
        assert tasks["s-1"][1:3] == ("lost", "worker-lost")
        replacement = await fleet.pool.fetchval(
            "SELECT worker FROM reaper.tasks WHERE replaces = 's-1'"
        )
        assert replacement == b


async def test_new_boot_shows_in_the_workers_row_within_two_heartbeats(fleet):
    a = fleet.name("a")
    await fleet.beat(a)
    await fleet.advance(HB, beating={a: {}})
    new_boot = fleet.reboot(a)
    await fleet.beat(a)
    # The row is written by an activity after the beat was handled: one more interval (the
    # test server skips no time while that activity runs) is within the two of §5.3.
    await fleet.advance(HB, beating={a: {}})
    row = await worker_row(fleet.pool, a)
    assert row["boot_id"] == new_boot and row["state"] == "running"


async def test_last_heartbeat_in_the_workers_row_lags_by_at_most_stall_after(fleet):
    a = fleet.name("a")
    await fleet.beat(a)
    for _ in range(6):
        await fleet.advance(HB, beating={a: {}})
        st = await fleet.state(a)
        written = await fleet.pool.fetchval(
            "SELECT last_heartbeat_at FROM reaper.workers WHERE name = $1", a
        )
        assert (st.last_heartbeat_at - written).total_seconds() <= 30


async def test_the_workers_row_is_refreshed_every_third_beat_at_the_defaults(fleet):
    """Patch ``refresh-at-bound``: with heartbeat 10 s and STALL_AFTER 30 s the row's
    ``last_heartbeat_at`` is written once its lag reaches 25 s, so every third beat (every
    other one before, which halved registration at 1,000 workers: BENCHMARKS.md metric 4),
    and the lag a reader sees stays under STALL_AFTER (§5.3)."""
    a = fleet.name("a")
    await fleet.beat(a)
    await fleet.advance(HB, beating={a: {}})
    seen = []
    for _ in range(9):
        await fleet.advance(HB, beating={a: {}})
        st = await fleet.state(a)
        written = await fleet.pool.fetchval(
            "SELECT last_heartbeat_at FROM reaper.workers WHERE name = $1", a
        )
        assert (st.last_heartbeat_at - written).total_seconds() < 30
        seen.append(written)
    writes = sum(1 for before, after in itertools.pairwise(seen) if after != before)
    assert writes in (2, 3), f"{writes} refreshes over 8 beats (every third beat: 2 or 3)"


REFUSE_REFRESHES = (
    "CREATE TABLE IF NOT EXISTS public.refused_refreshes (name text PRIMARY KEY)",
    "CREATE OR REPLACE FUNCTION public.refuse_refresh() RETURNS trigger LANGUAGE plpgsql AS"
    " $$ BEGIN IF NEW.name IN (SELECT name FROM public.refused_refreshes) THEN"
    " RAISE EXCEPTION 'refresh of % refused', NEW.name; END IF; RETURN NEW; END $$",
    "DROP TRIGGER IF EXISTS refuse_refresh ON reaper.workers",
    "CREATE TRIGGER refuse_refresh BEFORE UPDATE ON reaper.workers FOR EACH ROW"
    " WHEN (OLD.state = NEW.state AND OLD.last_heartbeat_at IS DISTINCT FROM"
    " NEW.last_heartbeat_at) EXECUTE FUNCTION public.refuse_refresh()",
)
"""A database that refuses one worker's heartbeat refreshes (and nothing else)."""


async def test_a_refused_row_refresh_never_stops_the_liveness_and_catches_up(fleet):
    """A refresh of ``last_heartbeat_at`` is a local activity that may fail (Postgres down):
    the liveness goes on judging beats, and the row catches up once writes succeed (§5.3)."""
    a = fleet.name("a")
    await fleet.beat(a)
    await fleet.advance(HB, beating={a: {}})
    run = (await fleet.client.get_workflow_handle(liveness_id(a)).describe()).run_id
    for sql in REFUSE_REFRESHES:
        await fleet.pool.execute(sql)
    try:
        await fleet.pool.execute("INSERT INTO public.refused_refreshes VALUES ($1)", a)
        await fleet.advance(4 * HB, beating={a: {}})
        st = await fleet.state(a)
        written = await fleet.pool.fetchval(
            "SELECT last_heartbeat_at FROM reaper.workers WHERE name = $1", a
        )
        assert st.state == "running" and st.last_seq is not None and st.last_seq >= 5
        assert (st.last_heartbeat_at - written).total_seconds() >= 30  # refused: it lags
        # The same run, still running: not one that failed and was started anew by a beat.
        desc = await fleet.client.get_workflow_handle(liveness_id(a), run_id=run).describe()
        assert desc.status == WorkflowExecutionStatus.RUNNING
        await fleet.pool.execute("DELETE FROM public.refused_refreshes WHERE name = $1", a)
        await fleet.advance(2 * HB, beating={a: {}})
        st = await fleet.state(a)
        written = await fleet.pool.fetchval(
            "SELECT last_heartbeat_at FROM reaper.workers WHERE name = $1", a
        )
        assert (st.last_heartbeat_at - written).total_seconds() <= 30
    finally:
        await fleet.pool.execute("DELETE FROM public.refused_refreshes WHERE name = $1", a)


async def test_churn_keeps_reaping_dead_hosts_while_a_partition_still_halts_reaping(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool
) -> None:
    """An autoscaled fleet of three replaces a host every 80 s, four times (lost after
    60 s, retired 60 s later: at most two dead hosts not yet retired beside three live ones,
    2/5 < 0.55). Without retirement the four dead hosts would outnumber the three live ones
    (4/7 >= 0.55: full disruption, no reap ever again); with it every dead host is reaped
    and retired. Then two of the three live hosts go silent at once (a partition): nothing
    is reaped. Live hosts beat every 20 s (within STALL_AFTER, 30 s)."""
    lost, step, every = 60, 20, 80
    async with fleet_with(time_env, pool, lost_after=lost, retire_after=lost) as fleet:
        hosts = [fleet.name(f"h{i}") for i in range(3)]

        async def join(host: str) -> None:
            await fleet.pool.execute(
                "INSERT INTO reaper.tasks (id, worker, state) VALUES ($1, $2, 'running')",
                f"t-{host}",
                host,
            )
            await fleet.beat(host, tasks=[f"t-{host}"])

        def beating(live: list[str]) -> dict[str, dict[str, Any]]:
            return {h: {"tasks": [f"t-{h}"]} for h in live}

        for h in hosts:
            await join(h)
        dead: list[str] = []
        for round_ in range(4):
            dead.append(hosts.pop(0))
            hosts.append(fleet.name(f"n{round_}"))
            await join(hosts[-1])
            await fleet.advance(every, beating=beating(hosts), step=step)
        await fleet.advance(2 * lost + 60, beating=beating(hosts), step=step)
        tasks = await task_states(fleet.pool)
        for h in dead:
            assert tasks[f"t-{h}"][1:3] == ("lost", "worker-lost"), f"dead host {h} not reaped"
        for h in dead:
            assert (await worker_row(fleet.pool, h))["state"] == "retired"
        assert (await fleet.pool.fetchrow("SELECT state FROM reaper.fleet"))["state"] == "normal"
        # A partition: two of the three live hosts fall silent together.
        survivor, silent = hosts[0], hosts[1:]
        await fleet.advance(lost + 60, beating=beating([survivor]), step=step)
        assert (await fleet.pool.fetchrow("SELECT state FROM reaper.fleet"))["state"] == "full"
        tasks = await task_states(fleet.pool)
        for h in silent:
            assert tasks[f"t-{h}"][1] == "running", f"{h} reaped during a partition"


async def test_rule7_a_retired_workers_tasks_stay_reaped_when_it_registers_afresh(fleet):
    a, b = fleet.name("a"), fleet.name("b")
    await setup_service(fleet.pool, "web", {a: ["t-a"], b: []})
    await fleet.beat(a, tasks=["t-a"])
    await fleet.beat(b, tasks=[])
    await signal(fleet, a, "retire", "reinstall")
    await fleet.retired(a)
    fleet.reboot(a)  # reinstalled, but its old task directory survived
    await fleet.beat(a, tasks=["t-a"])
    await eventually(
        lambda: fleet.state(a), lambda s: "t-a" in s.orphans, what="t-a listed as an orphan"
    )
    tasks = await task_states(fleet.pool)
    assert tasks["t-a"][1:3] == ("lost", "worker-retired")
    replacement = await fleet.pool.fetchrow(
        "SELECT worker, state FROM reaper.tasks WHERE replaces = 't-a'"
    )
    assert replacement["worker"] == b and replacement["state"] in ("pending", "running")
