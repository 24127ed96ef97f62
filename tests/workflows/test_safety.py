"""Reaping that stays safe under stalls, races, bad reports and operator actions.

Each test is named after the behaviour it proves, or after the CONTRACT.md §4 rule it checks
(``test_ruleN_...``). Time-skipping server; timings heartbeat 10 s,
stalled 30 s, lost 300 s, MISSING_TTL 300 s unless a test overrides them.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import UTC, timedelta
from typing import Any

from activities import ReaperActivities
from activities.types import ReapRequest, ReconcileInput, WorkerStateChange
from reaper.core.contract import WorkerState
from tests.support.controller import make_settings
from tests.support.fleet import fleet_with
from tests.support.heartbeats import send
from tests.support.polling import eventually
from tests.support.scheduler import insert, rows, setup_service, task_states
from tests.support.sealed import sealed

TTL = 300
LOST = 300


async def test_stuck_creating_row_failed_and_collected_after_creating_timeout(time_env, pool):
    # CREATING_TIMEOUT 10 min here (1 h by default) keeps the run short.
    async with fleet_with(time_env, pool, creating_timeout=600) as fleet:
        await _stuck_creating(fleet)


async def _stuck_creating(fleet) -> None:
    w = fleet.name("w")
    now = await fleet.env.get_current_time()
    await insert(fleet.pool, "containers", w, ["c-stuck"], state="creating", at=now)
    await insert(
        fleet.pool, "containers", w, ["c-young"], state="creating", at=now + timedelta(minutes=5)
    )
    await fleet.beat(w, containers=[])
    await fleet.advance(600 + 30, beating={w: {"containers": []}}, step=10)
    left = await rows(fleet.pool, "containers", w)
    assert set(left) == {"c-young"}, "stuck creating row not collected, or young one was"
    ev = await fleet.pool.fetch(
        "SELECT handle, action, reason FROM reaper.events WHERE kind = 'container'"
    )
    assert [tuple(e) for e in ev] == [("c-stuck", "destroyed", "creating-timeout")]


async def test_rule4_stalled_worker_handles_never_destroyed_and_first_report_decides(fleet):
    w, x, y = fleet.name("w"), fleet.name("x"), fleet.name("y")
    await insert(fleet.pool, "volumes", w, ["v-1", "v-2"])
    await fleet.beat(w, volumes=["v-1"])  # v-2 marked
    await fleet.beat(x)
    await fleet.beat(y)
    # w goes silent for longer than MISSING_TTL (stalled, then lost): nothing of it is
    # destroyed; it returns still holding v-2, and v-2 is kept.
    # x and y beat every 20 s (within STALL_AFTER): they only keep the fleet out of rule 6.
    await fleet.advance(TTL + LOST, beating={x: {}, y: {}}, step=20)
    assert set(await rows(fleet.pool, "volumes", w)) == {"v-1", "v-2"}
    st = await fleet.beat(w, volumes=["v-1", "v-2"])
    assert st.state == "running"
    await fleet.advance(TTL + 30, beating={w: {"volumes": ["v-1", "v-2"]}, x: {}, y: {}})
    assert (await rows(fleet.pool, "volumes", w)) == {"v-1": None, "v-2": None}
    assert (
        await fleet.pool.fetchval("SELECT count(*) FROM reaper.events WHERE action='destroyed'")
        == 0
    )


async def test_new_boot_with_wiped_state_marks_old_handles_on_first_report(fleet):
    w = fleet.name("w")
    handles = [f"c-{i}" for i in range(20)]
    await insert(fleet.pool, "containers", w, handles)
    await fleet.beat(w, containers=handles)
    fleet.reboot(w)  # wiped: holds nothing now
    st = await fleet.beat(w, containers=[])
    marked = await rows(fleet.pool, "containers", w)
    assert all(v is not None for v in marked.values()), "first report of a new boot not trusted"
    assert st.boot_id == fleet.boot[w]


async def test_mass_drop_report_marks_nothing_until_a_second_report_confirms(fleet):
    w = fleet.name("w")
    handles = [f"c-{i}" for i in range(20)]
    await insert(fleet.pool, "containers", w, handles)
    await fleet.beat(w, containers=handles)
    await fleet.beat(w, containers=handles[:5])  # drops 15 of 20 at once, same boot
    assert all(v is None for v in (await rows(fleet.pool, "containers", w)).values())
    await fleet.advance(10)
    await fleet.beat(w, containers=handles[:5])  # the same report again: confirmed
    marked = await rows(fleet.pool, "containers", w)
    assert sorted(h for h, v in marked.items() if v is not None) == sorted(handles[5:])


async def test_empty_report_from_a_worker_holding_many_is_held(fleet):
    w = fleet.name("w")
    handles = [f"v-{i}" for i in range(30)]
    await insert(fleet.pool, "volumes", w, handles)
    await fleet.beat(w, volumes=handles)
    await fleet.beat(w, volumes=[])
    assert all(v is None for v in (await rows(fleet.pool, "volumes", w)).values())
    await fleet.advance(10)
    await fleet.beat(w, volumes=handles)  # it was a glitch: nothing ever marked
    await fleet.advance(TTL + 30, beating={w: {"volumes": handles}})
    assert len(await rows(fleet.pool, "volumes", w)) == 30


async def test_small_drop_is_trusted_at_once(fleet):
    w = fleet.name("w")
    handles = [f"c-{i}" for i in range(20)]
    await insert(fleet.pool, "containers", w, handles)
    await fleet.beat(w, containers=handles)
    await fleet.beat(w, containers=handles[:-3])
    marked = await rows(fleet.pool, "containers", w)
    assert sorted(h for h, v in marked.items() if v is not None) == sorted(handles[-3:])


async def test_dry_run_records_would_actions_and_changes_nothing(time_env, pool):
    async with fleet_with(time_env, pool, dry_run=True) as fleet:
        a, b = fleet.name("a"), fleet.name("b")
        await insert(pool, "volumes", a, ["v-1", "v-2"])
        await setup_service(pool, "web", {a: ["t-a"], b: ["t-b"]})
        await pool.execute("UPDATE reaper.tasks SET state = 'running'")
        await fleet.beat(a, volumes=["v-1"], tasks=["t-a"])
        await fleet.beat(b, tasks=["t-b"])
        await fleet.advance(
            TTL + 30, beating={a: {"volumes": ["v-1"], "tasks": ["t-a"]}, b: {"tasks": ["t-b"]}}
        )
        # a dies: it would be reaped
        await fleet.advance(LOST + 30, beating={b: {"tasks": ["t-b"]}}, step=20)
        assert (await fleet.state(a)).state == "lost"
        assert (await rows(pool, "volumes", a)) == {"v-1": None, "v-2": None}
        assert {k: v[1] for k, v in (await task_states(pool)).items()} == {
            "t-a": "running",
            "t-b": "running",
        }
        actions = sorted(
            {
                r["action"]
                for r in await pool.fetch("SELECT action FROM reaper.events WHERE kind <> 'worker'")
            }
        )
        assert actions == ["would-destroyed", "would-lost", "would-mark", "would-replaced"]
        n = await pool.fetchval("SELECT count(*) FROM reaper.events WHERE action='would-destroyed'")
        assert n == 1, "a would-destroy recorded more than once"


async def test_automatic_reaps_are_rate_limited(time_env, pool):
    async with fleet_with(
        time_env, pool, reap_rate=0.01, reap_burst=1, disruption_threshold=1.0
    ) as fleet:
        a, b, c = fleet.name("a"), fleet.name("b"), fleet.name("c")
        await setup_service(pool, "web", {a: ["t-a"], b: ["t-b"], c: []})
        await pool.execute("UPDATE reaper.tasks SET state = 'running'")
        for n, t in ((a, ["t-a"]), (b, ["t-b"]), (c, [])):
            await fleet.beat(n, tasks=t)
        await fleet.advance(LOST + 20, beating={c: {"tasks": []}})
        lost = [k for k, v in (await task_states(pool)).items() if v[1] == "lost"]
        assert len(lost) == 1, "both reaped at once despite a burst of 1"
        await fleet.advance(110, beating={c: {"tasks": []}})  # one token per 100 s
        lost = [k for k, v in (await task_states(pool)).items() if v[1] == "lost"]
        assert sorted(lost) == ["t-a", "t-b"]


async def test_forced_reap_bypasses_disruption_guard_and_records_who(fleet):
    a, b = fleet.name("a"), fleet.name("b")
    await setup_service(fleet.pool, "web", {a: ["t-a"], b: ["t-b"]})
    await fleet.pool.execute("UPDATE reaper.tasks SET state = 'running'")
    await fleet.beat(a, tasks=["t-a"])
    await fleet.beat(b, tasks=["t-b"])
    await fleet.advance(LOST + 30)  # both silent: full disruption
    assert await fleet.pool.fetchval("SELECT state FROM reaper.fleet") == "full"
    assert {v[1] for v in (await task_states(fleet.pool)).values()} == {"running"}
    await fleet.client.get_workflow_handle(f"liveness-{a}").signal(
        "force_reap", {"reason": "rack 7 powered off", "actor": "oncall-bob"}
    )
    await eventually(
        lambda: task_states(fleet.pool),
        lambda t: t["t-a"][1] == "lost",
        what="forced reap in full disruption",
    )
    ev = await fleet.pool.fetchrow("SELECT reason, actor FROM reaper.events WHERE action='lost'")
    assert tuple(ev) == ("rack 7 powered off", "oncall-bob")
    assert (await task_states(fleet.pool))["t-b"][1] == "running"


async def test_forced_reap_refused_for_worker_that_never_beat(fleet):
    w = fleet.name("w")
    st = await fleet.raw(w, {"worker": w, "seq": "bad"})  # exists, never beat validly
    await fleet.client.get_workflow_handle(f"liveness-{w}").signal("force_reap", {"reason": "x"})
    st = await eventually(lambda: fleet.state(w), lambda s: s.rejected == 2)
    assert "never sent a valid heartbeat" in (st.last_rejection or "")
    assert await fleet.pool.fetchval("SELECT count(*) FROM reaper.events") == 0


async def test_heartbeat_in_the_middle_of_a_reap_leaves_no_task_half_reaped(pool):
    """The reap (one transaction) and a returning worker's report race on Postgres."""
    acts = ReaperActivities(pool, make_settings())
    from datetime import datetime

    for round_ in range(20):
        w, other = f"w{round_}-{uuid.uuid4().hex[:4]}", f"o{round_}-{uuid.uuid4().hex[:4]}"
        svc = f"svc-{round_}"
        await pool.execute("INSERT INTO reaper.services VALUES ($1, 5)", svc)
        ids = [f"{svc}-t{i}" for i in range(5)]
        await pool.executemany(
            "INSERT INTO reaper.tasks (id, service, worker, state) VALUES ($1, $2, $3, 'running')",
            [(i, svc, w) for i in ids],
        )
        now = datetime.now(UTC)
        for name, state in ((other, WorkerState.running), (w, WorkerState.lost)):
            await acts.record_worker_state(
                WorkerStateChange(
                    worker=name, state=state, at=now, forced_reap=state is WorkerState.lost
                )
            )
        reap = acts.reap_worker(
            ReapRequest(
                worker=w, reason="lost", actor="reaper", forced=True, lost_after=300, at=now
            )
        )

        async def returning(w: str, ids: list[str], now: datetime) -> None:
            await acts.record_worker_state(
                WorkerStateChange(
                    worker=w, state=WorkerState.running, at=now + timedelta(seconds=1)
                )
            )
            await acts.reconcile_report(
                ReconcileInput(
                    worker=w,
                    kind="tasks",
                    handles=ids,
                    taken_at=now + timedelta(seconds=1),
                    missing_ttl=300,
                    report=sealed(w, "tasks", ids, now + timedelta(seconds=1)),
                )
            )

        await asyncio.gather(reap, returning(w, ids, now))
        states = [
            r["state"]
            for r in await pool.fetch(
                "SELECT state FROM reaper.tasks WHERE id = ANY($1::text[])", ids
            )
        ]
        assert len(set(states)) == 1, f"half-reaped: {states}"
        replaced = await pool.fetchval(
            "SELECT count(*) FROM reaper.tasks WHERE replaces = ANY($1::text[])", ids
        )
        assert replaced == (5 if states[0] == "lost" else 0)
        active = await pool.fetchval(
            "SELECT count(*) FROM reaper.tasks"
            " WHERE service = $1 AND state IN ('pending','running')",
            svc,
        )
        assert active == 5


async def test_rule4_return_clears_marks_and_the_missing_count_shown(fleet):
    """CONTRACT §2: query `state` `missing` is the count of handles marked now. A return
    clears every mark (CONTRACT.md rule 4); the count shown (and ReaperMissing) follows at
    once, not at the next reconciled report. Found by the timelines of tests/test_property.py."""
    w = fleet.name("w")
    now = await fleet.env.get_current_time()
    await fleet.pool.execute(
        "INSERT INTO reaper.containers (handle, worker, state, state_changed_at)"
        " VALUES ('c-1', $1, 'created', $2)",
        w,
        now,
    )

    def marked() -> Any:
        return fleet.pool.fetchval(
            "SELECT count(*) FROM reaper.containers"
            " WHERE worker = $1 AND missing_since IS NOT NULL",
            w,
        )

    await fleet.beat(w, containers=[])  # c-1 marked missing
    assert await marked() == 1
    await eventually(lambda: fleet.state(w), lambda s: s.missing == 1, what="missing 1")
    await fleet.env.sleep(40)  # silent: stalled
    assert (await fleet.state(w)).state == "stalled"
    st = await fleet.beat(w)  # back, liveness only
    assert st.state == "running"
    # CONTRACT.md rule 4: time stalled does not count, the marks restart: none is left in Postgres.
    await eventually(marked, lambda n: n == 0, what="marks cleared by the return")
    await fleet.advance(20, beating={w: {}})  # it goes on beating, liveness only
    await eventually(
        lambda: fleet.state(w),
        lambda s: s.missing == 0,
        timeout=5.0,
        what="state missing back to 0",
    )


async def test_rule4_report_pending_across_a_stall_never_decides_after_the_return(fleet):
    """A complete report that reached the liveness while Postgres failed stays pending; the
    worker stalls, and returns with a liveness-only beat. That report was taken before the
    return: it must not mark (it would count the time stalled), and the first complete report
    after the return starts the TTL. Found by the timelines of tests/test_property.py."""
    w = fleet.name("w")
    t0 = await fleet.env.get_current_time()
    await fleet.pool.execute(
        "INSERT INTO reaper.containers (handle, worker, state, state_changed_at)"
        " VALUES ('c-1', $1, 'created', $2)",
        w,
        t0,
    )
    await fleet.beat(w, containers=["c-1"])
    # Postgres fails the liveness's writes (as in a restart): recording `stalled` retries.
    async with table_unavailable(fleet.pool, "fleet") as restore:
        await _pending_across_a_stall(fleet, w, restore)


async def _pending_across_a_stall(fleet, w: str, restore) -> None:
    await fleet.env.sleep(40)
    assert (await fleet.state(w)).state == "stalled"
    # t1: it beats once, with a complete report lacking c-1; the report waits for Postgres.
    fleet.seq[w] += 1
    await send(
        fleet.client,
        fleet.tq,
        {"worker": w, "boot_id": fleet.boot[w], "seq": fleet.seq[w], "containers": []},
    )
    st = await eventually(
        lambda: fleet.state(w), lambda s: s.last_seq == fleet.seq[w], what="beat at t1 handled"
    )
    assert st.pending_reports == 1
    await fleet.env.sleep(40)  # silent again
    await restore()
    await fleet.env.sleep(11)  # Postgres back: judged and recorded
    assert (await fleet.state(w)).state == "stalled"
    assert (
        await fleet.pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", w)
        == "stalled"
    )
    t2 = await fleet.env.get_current_time()
    await fleet.beat(w)  # t2: back, liveness only
    since = await fleet.pool.fetchval(
        "SELECT missing_since FROM reaper.containers WHERE handle = 'c-1' AND worker = $1", w
    )
    assert since is None, f"c-1 marked missing since {since}, before the return at {t2}"
    await fleet.advance(260, beating={w: {}})  # liveness-only beats
    t3 = await fleet.env.get_current_time()
    await fleet.beat(w, containers=[])  # first complete report since t2
    destroyed = await fleet.pool.fetchval(
        "SELECT count(*) FROM reaper.events WHERE handle = 'c-1' AND worker = $1"
        " AND action = 'destroyed'",
        w,
    )
    assert destroyed == 0, (
        f"c-1 destroyed {(t3 - t2).total_seconds():.0f} s after the return,"
        " on the first complete report since it"
    )
    since = await fleet.pool.fetchval(
        "SELECT missing_since FROM reaper.containers WHERE handle = 'c-1' AND worker = $1", w
    )
    assert since is not None and since >= t3, "the first report since the return marks it"


@contextlib.asynccontextmanager
async def table_unavailable(pool, table: str):
    """Make ``reaper.{table}`` fail every statement (renamed away) until ``restore()`` or the
    end of the block, whichever comes first."""
    gone = f"{table}_unavailable"
    await pool.execute(f"ALTER TABLE reaper.{table} RENAME TO {gone}")
    restored = False

    async def restore() -> None:
        nonlocal restored
        if not restored:
            await pool.execute(f"ALTER TABLE reaper.{gone} RENAME TO {table}")
            restored = True

    try:
        yield restore
    finally:
        await restore()


async def test_rule4_silence_the_busy_liveness_did_not_judge_still_counts_as_a_stall(fleet):
    """The liveness is stuck in an activity (a drain whose event write fails) while the worker
    is silent for longer than STALL_AFTER, so no timer got to judge it stalled. Its next beat
    is still a return: marks made before the silence are cleared (CONTRACT.md rule 4) and
    Postgres shows the worker running since the return."""
    w = fleet.name("w")
    await insert(fleet.pool, "containers", w, ["c-1", "c-2"])
    await fleet.beat(w, containers=["c-1"])
    assert (await rows(fleet.pool, "containers", w))["c-2"] is not None
    async with table_unavailable(fleet.pool, "events") as restore:
        await fleet.client.get_workflow_handle(f"liveness-{w}").signal(
            "drain", {"reason": "test", "actor": "op"}
        )
        await fleet.env.sleep(45)  # silent; the liveness retries the drain
        st = await fleet.state(w)
        assert st.state == "running" and not st.draining, "the drain must still be stuck"
        t1 = await fleet.env.get_current_time()
        fleet.seq[w] += 1
        await send(
            fleet.client, fleet.tq, {"worker": w, "boot_id": fleet.boot[w], "seq": fleet.seq[w]}
        )
        await eventually(
            lambda: fleet.state(w),
            lambda s: s.last_seq == fleet.seq[w],
            what="the beat after the silence handled",
        )
        await restore()
        await eventually(
            lambda: rows(fleet.pool, "containers", w),
            lambda r: r["c-2"] is None,
            what="marks cleared by the return",
        )
    since = await fleet.pool.fetchval("SELECT state_since FROM reaper.workers WHERE name = $1", w)
    assert since >= t1, f"running since {since}, not since the return at {t1}"


async def test_forced_reap_is_not_undone_by_a_beat_right_after_it(fleet):
    """An operator force-reaps a worker that is still beating; its next beat lands before the
    controller acted on the request. The reap still happens (the worker stays lost until it
    is done), and the worker then returns with its reaped task as an orphan (CONTRACT.md
    rule 7)."""
    a, b = fleet.name("a"), fleet.name("b")
    await setup_service(fleet.pool, "web", {a: ["t-a"], b: ["t-b"]})
    await fleet.pool.execute(
        "UPDATE reaper.tasks SET state = 'running' WHERE id = ANY($1::text[])", ["t-a", "t-b"]
    )
    await fleet.beat(a, tasks=["t-a"])
    await fleet.beat(b, tasks=["t-b"])
    handle = fleet.client.get_workflow_handle(f"liveness-{a}")
    # The liveness is busy (a drain whose event write fails) while the request and the beat
    # arrive, so both reach it in one activation, the beat after the request.
    async with table_unavailable(fleet.pool, "events") as restore:
        await handle.signal("drain", {"reason": "test", "actor": "op"})
        await handle.signal("force_reap", {"reason": "disk failed", "actor": "oncall"})
        fleet.seq[a] += 1
        await send(
            fleet.client,
            fleet.tq,
            {"worker": a, "boot_id": fleet.boot[a], "seq": fleet.seq[a], "tasks": ["t-a"]},
        )
        await restore()
    await eventually(
        lambda: task_states(fleet.pool),
        lambda t: t["t-a"][1] == "lost",
        what="t-a lost by the forced reap",
    )
    # Back after the reap: a beat that lands while the reap child is still finishing (t-a is
    # already lost) is held like the one above; the first after it is the return.
    await eventually(
        lambda: fleet.beat(a, tasks=["t-a"]),
        lambda s: s.state == "running",
        what="a back after the reap",
    )
    await eventually(
        lambda: fleet.state(a),
        lambda s: "t-a" in s.orphans,
        what="the reaped task listed as an orphan",
    )
    assert (await task_states(fleet.pool))["t-a"][1] == "lost"
