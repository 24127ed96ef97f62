"""Liveness and reaping under the time-skipping server: CONTRACT.md rules 5-7 and §2.

Timings: heartbeat 10 s, stalled after 30 s, lost after 300 s, disruption threshold 0.55.
"""

from __future__ import annotations

from tests.support.polling import eventually
from tests.support.scheduler import setup_service, task_states

LOST = 300
LIVE = 20
"""How often live workers beat through the long waits (``step``): every 2 heartbeat
intervals, within STALL_AFTER, as in test_fleet_changes' churn; half the beats of 10 s."""


async def test_rule5_pending_task_becomes_running_when_reported(fleet):
    w = fleet.name("w")
    await setup_service(fleet.pool, "web", {w: ["t-1"]})
    await fleet.beat(w, tasks=[])
    # The collector signals the assignments back after its reconcile: wait for that signal.
    await eventually(
        lambda: fleet.state(w), lambda s: s.assignments == ["t-1"], what="t-1 assigned to w"
    )
    await fleet.beat(w, tasks=["t-1"])
    assert (await task_states(fleet.pool))["t-1"][1] == "running"
    await fleet.advance(10)
    await fleet.beat(w, tasks=["t-1"])
    await eventually(
        lambda: fleet.state(w), lambda s: s.assignments == [], what="t-1 no longer assigned"
    )


async def test_stalled_then_lost_on_the_controller_clock(fleet):
    w, x, y = fleet.name("w"), fleet.name("x"), fleet.name("y")
    for n in (w, x, y):
        await fleet.beat(n)
    await fleet.advance(20, beating={x: {}, y: {}})
    assert (await fleet.state(w)).state == "running"
    await fleet.advance(20, beating={x: {}, y: {}})
    assert (await fleet.state(w)).state == "stalled"
    await fleet.advance(LOST - 60, beating={x: {}, y: {}}, step=LIVE)
    assert (await fleet.state(w)).state == "stalled"
    await fleet.advance(40, beating={x: {}, y: {}})
    assert (await fleet.state(w)).state == "lost"
    row = await fleet.pool.fetchrow("SELECT state FROM reaper.workers WHERE name = $1", w)
    assert row["state"] == "lost"
    reasons = [
        r["reason"]
        for r in await fleet.pool.fetch(
            "SELECT reason FROM reaper.events WHERE worker = $1 AND action = 'state' ORDER BY id", w
        )
    ]
    assert reasons[0] == "new -> running" and reasons[1] == "running -> stalled"
    assert reasons[2].startswith("stalled -> lost")


async def test_rule5_lost_worker_reaped_and_service_backfilled_on_fewest_loaded(fleet):
    a, b, c = fleet.name("a"), fleet.name("b"), fleet.name("c")
    await setup_service(fleet.pool, "web", {a: ["t-a1", "t-a2"], b: ["t-b1"], c: []})
    await fleet.beat(a, tasks=["t-a1", "t-a2"])
    await fleet.beat(b, tasks=["t-b1"])
    await fleet.beat(c, tasks=[])
    live = {b: {"tasks": ["t-b1"]}, c: {"tasks": []}}
    await fleet.advance(LOST + 20, beating=live, step=LIVE)
    assert (await fleet.state(a)).state == "lost"
    tasks = await task_states(fleet.pool)
    assert tasks["t-a1"][1:3] == ("lost", "worker-lost")
    assert tasks["t-a2"][1:3] == ("lost", "worker-lost")
    replacements = {t: v for t, v in tasks.items() if v[3] is not None}
    assert sorted(v[3] for v in replacements.values()) == ["t-a1", "t-a2"]
    # fewest running first: c (0) gets one, then b and c are level (1 each): b by name... the
    # point is that the least loaded worker got work first and the lost one got none.
    placed_on = sorted(v[0] for v in replacements.values())
    assert a not in placed_on and c in placed_on
    running_or_pending = [t for t, v in tasks.items() if v[1] in ("running", "pending")]
    assert len(running_or_pending) == 3
    events = await fleet.pool.fetch("SELECT action, actor FROM reaper.events WHERE kind='task'")
    assert sorted(e["action"] for e in events) == ["lost", "lost", "replaced", "replaced"]


async def test_drain_stops_new_placements(fleet):
    a, b, c = fleet.name("a"), fleet.name("b"), fleet.name("c")
    await setup_service(fleet.pool, "web", {a: ["t-a"], b: [], c: []})
    for n in (a, b, c):
        await fleet.beat(n, tasks=["t-a"] if n == a else [])
    await fleet.client.get_workflow_handle(f"liveness-{b}").signal(
        "drain", {"reason": "kernel upgrade"}
    )
    await fleet.settle(b)
    await fleet.advance(10, beating={a: {"tasks": ["t-a"]}, b: {"tasks": []}, c: {"tasks": []}})
    assert await fleet.pool.fetchval("SELECT draining FROM reaper.workers WHERE name=$1", b)
    await fleet.advance(LOST + 20, beating={b: {"tasks": []}, c: {"tasks": []}}, step=LIVE)
    repl = await fleet.pool.fetch("SELECT worker FROM reaper.tasks WHERE replaces = 't-a'")
    assert [r["worker"] for r in repl] == [c]


async def test_rule5_force_reap_now_with_operator_reason(fleet):
    a, b = fleet.name("a"), fleet.name("b")
    await setup_service(fleet.pool, "web", {a: ["t-a"], b: []})
    await fleet.beat(a, tasks=["t-a"])
    await fleet.beat(b, tasks=[])
    await fleet.client.get_workflow_handle(f"liveness-{a}").signal(
        "force_reap", {"reason": "host decommissioned", "actor": "alice"}
    )
    from tests.support.polling import eventually

    await eventually(
        lambda: task_states(fleet.pool), lambda t: t["t-a"][1] == "lost", what="forced reap"
    )
    ev = await fleet.pool.fetchrow(
        "SELECT reason, actor FROM reaper.events WHERE action = 'lost' AND handle = 't-a'"
    )
    assert (ev["reason"], ev["actor"]) == ("host decommissioned", "alice")
    await eventually(
        lambda: task_states(fleet.pool),
        lambda t: any(v[3] == "t-a" and v[0] == b for v in t.values()),
        what="replacement on b",
    )


async def test_rule7_returning_reaped_worker_lists_reaped_tasks_as_orphans(fleet):
    a, b = fleet.name("a"), fleet.name("b")
    await setup_service(fleet.pool, "web", {a: ["t-a"], b: []})
    await fleet.beat(a, tasks=["t-a"])
    await fleet.beat(b, tasks=[])
    await fleet.advance(LOST + 20, beating={b: {"tasks": []}}, step=LIVE)
    repl = await fleet.pool.fetchval("SELECT id FROM reaper.tasks WHERE replaces = 't-a'")
    await fleet.beat(b, tasks=[])
    await eventually(
        lambda: fleet.state(b), lambda s: s.assignments == [repl], what="replacement assigned"
    )
    await fleet.beat(b, tasks=[repl])
    fleet.reboot(a)  # comes back, still holding t-a
    st = await fleet.beat(a, tasks=["t-a"])
    assert st.state == "running"
    st = await fleet.state(a)
    assert st.orphans == ["t-a"]
    tasks = await task_states(fleet.pool)
    assert tasks["t-a"][1] == "lost" and tasks[repl][1] == "running"
    await fleet.beat(a, tasks=[])  # the agent removed it
    assert (await fleet.state(a)).orphans == []


async def test_rule6_nothing_reaped_in_full_disruption(fleet):
    a, b, c = fleet.name("a"), fleet.name("b"), fleet.name("c")
    await setup_service(fleet.pool, "web", {a: ["t-a"], b: ["t-b"], c: ["t-c"]})
    for n, t in ((a, "t-a"), (b, "t-b"), (c, "t-c")):
        await fleet.beat(n, tasks=[t])
    # a and b go silent: 2 of 3 unhealthy >= 0.55 -> full disruption, no reaping.
    await fleet.advance(LOST + 60, beating={c: {"tasks": ["t-c"]}}, step=LIVE)
    assert (await fleet.state(a)).state == "lost"
    assert await fleet.pool.fetchval("SELECT state FROM reaper.fleet") == "full"
    assert {v[1] for v in (await task_states(fleet.pool)).values()} == {"running"}
    # b returns: 1 of 3 unhealthy -> partial; a is reaped only after a fresh LOST_AFTER.
    await fleet.beat(b, tasks=["t-b"])
    assert await fleet.pool.fetchval("SELECT state FROM reaper.fleet") == "partial"
    live = {b: {"tasks": ["t-b"]}, c: {"tasks": ["t-c"]}}
    await fleet.advance(LOST - 60, beating=live, step=LIVE)
    assert (await task_states(fleet.pool))["t-a"][1] == "running", (
        "reaped before a fresh LOST_AFTER"
    )
    await fleet.advance(120, beating=live, step=LIVE)
    assert (await task_states(fleet.pool))["t-a"][1] == "lost"


async def test_rule6_destroys_stop_in_full_disruption(fleet):
    a, b = fleet.name("a"), fleet.name("b")
    await fleet.pool.execute(
        "INSERT INTO reaper.volumes (handle, worker, state) VALUES ('v-1', $1, 'created')", a
    )
    await fleet.beat(a, volumes=[])
    await fleet.beat(b)
    # b stalls: 1 of 2 unhealthy (0.5 < 0.55: partial) -- lower the bar with a third silent
    c = fleet.name("c")
    await fleet.beat(c)
    await fleet.advance(400, beating={a: {"volumes": []}})
    assert await fleet.pool.fetchval("SELECT state FROM reaper.fleet") == "full"
    assert await fleet.pool.fetchval("SELECT count(*) FROM reaper.volumes") == 1


async def test_malformed_heartbeats_change_nothing(fleet):
    w = fleet.name("w")
    await fleet.beat(w, containers=["c-1"])
    good = await fleet.state(w)
    bad_payloads = [
        {"worker": w, "boot_id": "b", "seq": "x"},
        {"worker": w, "boot_id": "b", "seq": -4},
        {"worker": "someone-else", "boot_id": "b", "seq": 100},
        {"worker": w, "seq": 100},
        {"worker": w, "boot_id": "b", "seq": 100, "containers": ["ok", "bad\x00"]},
        {"worker": w, "boot_id": "b", "seq": 100, "volumes": "v-1"},
        ["not", "an", "object"],
        "plain string",
        None,
    ]
    for p in bad_payloads:
        await fleet.raw(w, p)
    st = await fleet.state(w)
    assert st.rejected == len(bad_payloads)
    assert (st.boot_id, st.last_seq, st.last_heartbeat_at) == (
        good.boot_id,
        good.last_seq,
        good.last_heartbeat_at,
    )
    assert st.state == "running"
    st = await fleet.beat(w, containers=["c-1"])  # and the workflow still works
    assert st.last_seq == good.last_seq + 1


async def test_duplicate_late_and_old_boot_beats_change_nothing(fleet):
    w = fleet.name("w")
    await fleet.pool.execute(
        "INSERT INTO reaper.containers (handle, worker) VALUES ('c-1', $1), ('c-2', $1)", w
    )
    old_boot = fleet.reboot(w)
    await fleet.beat(w, containers=["c-1", "c-2"])
    await fleet.beat(w, containers=["c-1", "c-2"])
    new_boot = fleet.reboot(w)
    await fleet.beat(w, containers=["c-1", "c-2"])
    # duplicate of the current beat, a late beat of the old boot claiming c-2 is gone
    await fleet.raw(w, {"worker": w, "boot_id": new_boot, "seq": 0, "containers": ["c-1"]})
    await fleet.raw(w, {"worker": w, "boot_id": old_boot, "seq": 99, "containers": ["c-1"]})
    after = await fleet.state(w)
    assert (after.boot_id, after.last_seq) == (new_boot, 0)
    assert after.rejected == 0
    marks = await fleet.pool.fetch("SELECT missing_since FROM reaper.containers")
    assert all(m["missing_since"] is None for m in marks)


async def test_a_reap_whose_id_is_taken_is_tried_again_under_the_next_id(fleet):
    """A liveness reset to before its reap (activities/repair.py) finds ``reap-{w}-1`` still
    running: it neither fails its task nor gives up; the next id reaps (rule 5)."""
    a, b, c = fleet.name("a"), fleet.name("b"), fleet.name("c")
    await setup_service(fleet.pool, "web", {a: ["t-a1"], b: [], c: []})
    # A workflow under the id of a's first reap that never ends (nobody polls its queue).
    await fleet.client.start_workflow("Placeholder", id=f"reap-{a}-1", task_queue=f"nobody-{a}")
    await fleet.beat(a, tasks=["t-a1"])
    await fleet.beat(b, tasks=[])
    await fleet.beat(c, tasks=[])
    await fleet.advance(LOST + 40, beating={b: {"tasks": []}, c: {"tasks": []}}, step=LIVE)
    assert (await fleet.state(a)).state == "lost"
    await eventually(
        lambda: task_states(fleet.pool),
        lambda tasks: tasks["t-a1"][1:3] == ("lost", "worker-lost"),
        what="t-a1 reaped by reap 2",
    )
    second = await fleet.client.get_workflow_handle(f"reap-{a}-2").describe()
    assert second.status is not None and second.status.name == "COMPLETED"
