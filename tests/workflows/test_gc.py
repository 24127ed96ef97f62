"""Report GC under the time-skipping server: CONTRACT.md rules 1-4, one test per rule.

Timings (tests/support/controller.py make_settings): heartbeat 10 s, stalled after 30 s, lost after
300 s, MISSING_TTL 300 s, resync 30 s.
"""

from __future__ import annotations

from tests.support.polling import eventually
from tests.support.scheduler import insert, rows

TTL = 300


async def test_rule4_missing_volume_destroyed_after_ttl_and_not_before(fleet):
    w = fleet.name("w")
    await insert(fleet.pool, "volumes", w, ["v-1", "v-2"])
    await fleet.beat(w, volumes=["v-1", "v-2"])
    st = await fleet.beat(w, volumes=["v-1"])
    marked = await rows(fleet.pool, "volumes", w)
    assert marked["v-2"] is not None and marked["v-1"] is None
    await fleet.advance(TTL - 20, beating={w: {"volumes": ["v-1"]}})
    assert "v-2" in await rows(fleet.pool, "volumes", w), "destroyed before MISSING_TTL"
    await fleet.advance(40, beating={w: {"volumes": ["v-1"]}})
    assert set(await rows(fleet.pool, "volumes", w)) == {"v-1"}
    events = await fleet.pool.fetch(
        "SELECT kind, handle, action FROM reaper.events WHERE action = 'destroyed'"
    )
    assert [tuple(e) for e in events] == [("volume", "v-2", "destroyed")]
    st = await fleet.state(w)
    assert st.missing == 0 and st.state == "running"


async def test_rule4_handle_that_reappears_is_kept_and_cleared(fleet):
    w = fleet.name("w")
    await insert(fleet.pool, "containers", w, ["c-1", "c-2"])
    await fleet.beat(w, containers=["c-1"])
    assert (await rows(fleet.pool, "containers", w))["c-2"] is not None
    await fleet.advance(TTL - 50, beating={w: {"containers": ["c-1"]}})
    await fleet.beat(w, containers=["c-1", "c-2"])  # back before the TTL ran out
    assert (await rows(fleet.pool, "containers", w))["c-2"] is None
    await fleet.advance(TTL + 60, beating={w: {"containers": ["c-1", "c-2"]}})
    assert set(await rows(fleet.pool, "containers", w)) == {"c-1", "c-2"}


async def test_rule4_one_report_holding_the_handle_restarts_its_clock(fleet):
    w = fleet.name("w")
    await insert(fleet.pool, "containers", w, ["c-1", "c-2"])
    await fleet.beat(w, containers=["c-1"])
    first_mark = (await rows(fleet.pool, "containers", w))["c-2"]
    await fleet.advance(TTL - 30, beating={w: {"containers": ["c-1"]}})
    await fleet.beat(w, containers=["c-1", "c-2"])  # one report holds it
    await fleet.beat(w, containers=["c-1"])  # then gone again
    second_mark = (await rows(fleet.pool, "containers", w))["c-2"]
    assert second_mark is not None and second_mark > first_mark
    await fleet.advance(60, beating={w: {"containers": ["c-1"]}})
    assert "c-2" in await rows(fleet.pool, "containers", w), "destroyed on the old clock"


async def test_rule2_creating_rows_are_never_marked(fleet):
    w = fleet.name("w")
    now = await fleet.env.get_current_time()
    await insert(fleet.pool, "containers", w, ["c-new"], state="creating", at=now)
    await insert(fleet.pool, "volumes", w, ["v-new"], state="creating", at=now)
    await fleet.beat(w, containers=[], volumes=[])
    await fleet.advance(TTL * 2, beating={w: {"containers": [], "volumes": []}})
    assert (await rows(fleet.pool, "containers", w)) == {"c-new": None}
    assert (await rows(fleet.pool, "volumes", w)) == {"v-new": None}


async def test_rule2_row_created_after_the_report_was_taken_is_not_marked(fleet):
    w = fleet.name("w")
    await fleet.beat(w, containers=["c-1"])
    # The scheduler's c-2 turns `created` a moment after the agent took its next report
    # (which therefore cannot hold it), and before that report is reconciled.
    taken_at = await fleet.env.get_current_time()
    await fleet.pool.execute(
        "INSERT INTO reaper.containers (handle, worker, state) VALUES ('c-2', $1, 'creating')", w
    )
    # (The test server's clock runs ahead of Postgres', so stamp the change by hand.)
    await fleet.pool.execute("ALTER TABLE reaper.containers DISABLE TRIGGER containers_touch")
    await fleet.pool.execute(
        "UPDATE reaper.containers SET state = 'created',"
        " state_changed_at = $1::timestamptz + interval '2 s' WHERE handle = 'c-2'",
        taken_at,
    )
    await fleet.pool.execute("ALTER TABLE reaper.containers ENABLE TRIGGER containers_touch")
    st = await fleet.beat(w, containers=["c-1", "c-unknown"])  # a changed report
    assert (await rows(fleet.pool, "containers", w))["c-2"] is None
    assert st.missing == 0
    # The next report, taken after the change, does mark it.
    await fleet.advance(10)
    await fleet.beat(w, containers=["c-1"])
    assert (await rows(fleet.pool, "containers", w))["c-2"] is not None


async def test_rule3_unchanged_report_writes_nothing(fleet):
    w = fleet.name("w")
    await insert(fleet.pool, "containers", w, [f"c-{i}" for i in range(50)])
    await fleet.beat(w, containers=[f"c-{i}" for i in range(40)])  # 10 marked
    before = {
        r["handle"]: r["xmin"]
        for r in await fleet.pool.fetch(
            "SELECT handle, xmin::text AS xmin FROM reaper.containers WHERE worker = $1", w
        )
    }
    # Same report again, and again after the resync interval (a read, no write).
    await fleet.advance(40, beating={w: {"containers": [f"c-{i}" for i in range(40)]}})
    after = {
        r["handle"]: r["xmin"]
        for r in await fleet.pool.fetch(
            "SELECT handle, xmin::text AS xmin FROM reaper.containers WHERE worker = $1", w
        )
    }
    assert after == before


async def test_rule3_changed_report_writes_only_what_changed(fleet):
    w = fleet.name("w")
    await insert(fleet.pool, "containers", w, [f"c-{i}" for i in range(20)])
    await fleet.beat(w, containers=[f"c-{i}" for i in range(20)])
    before = {
        r["handle"]: r["xmin"]
        for r in await fleet.pool.fetch(
            "SELECT handle, xmin::text AS xmin FROM reaper.containers WHERE worker = $1", w
        )
    }
    await fleet.beat(w, containers=[f"c-{i}" for i in range(19)])  # c-19 gone
    after = {
        r["handle"]: r["xmin"]
        for r in await fleet.pool.fetch(
            "SELECT handle, xmin::text AS xmin FROM reaper.containers WHERE worker = $1", w
        )
    }
    assert [h for h in before if before[h] != after[h]] == ["c-19"]


async def test_rule1_and_4_stalled_time_does_not_count(fleet):
    w = fleet.name("w")
    await insert(fleet.pool, "volumes", w, ["v-1", "v-2"])
    await fleet.beat(w, volumes=["v-1"])
    await fleet.advance(100, beating={w: {"volumes": ["v-1"]}})
    await fleet.advance(200)  # silent: stalled, not lost
    assert (await fleet.state(w)).state == "stalled"
    assert "v-2" in await rows(fleet.pool, "volumes", w)
    st = await fleet.beat(w, volumes=["v-1"])  # returns, v-2 still absent
    assert st.state == "running"
    # TTL counts from the return: 300 s after it, not after the first mark.
    await fleet.advance(TTL - 30, beating={w: {"volumes": ["v-1"]}})
    assert "v-2" in await rows(fleet.pool, "volumes", w), "stalled time counted toward TTL"
    await fleet.advance(60, beating={w: {"volumes": ["v-1"]}})
    assert "v-2" not in await rows(fleet.pool, "volumes", w)


async def test_rule1_liveness_only_beats_mark_nothing(fleet):
    w = fleet.name("w")
    await insert(fleet.pool, "containers", w, ["c-1"])
    await fleet.beat(w)
    await fleet.advance(TTL * 2, beating={w: {}})
    assert (await rows(fleet.pool, "containers", w)) == {"c-1": None}


async def test_rule4_missing_task_stopped_and_service_backfilled(fleet):
    a, b = fleet.name("a"), fleet.name("b")
    await fleet.pool.execute("INSERT INTO reaper.services (name, desired_count) VALUES ('web', 2)")
    await fleet.pool.execute(
        "INSERT INTO reaper.tasks (id, service, worker, state) VALUES"
        " ('t-a', 'web', $1, 'pending'), ('t-b', 'web', $2, 'pending')",
        a,
        b,
    )
    await fleet.beat(a, tasks=[])
    # the collector signals the assignments back after the reconcile: wait for that signal
    await eventually(
        lambda: fleet.state(a), lambda s: s.assignments == ["t-a"], what="t-a assigned to a"
    )
    await fleet.beat(a, tasks=["t-a"])
    await fleet.beat(b, tasks=["t-b"])
    states = dict(await fleet.pool.fetch("SELECT id, state FROM reaper.tasks"))
    assert states == {"t-a": "running", "t-b": "running"}
    await fleet.beat(a, tasks=[])  # t-a vanished from a
    await fleet.advance(TTL + 20, beating={a: {"tasks": []}, b: {"tasks": ["t-b"]}})
    t_a = await fleet.pool.fetchrow("SELECT state, stop_reason FROM reaper.tasks WHERE id='t-a'")
    assert tuple(t_a) == ("stopped", "missing")
    repl = await fleet.pool.fetch(
        "SELECT id, worker, state FROM reaper.tasks WHERE replaces = 't-a'"
    )
    assert len(repl) == 1 and repl[0]["state"] == "pending"
    actions = [
        r["action"]
        for r in await fleet.pool.fetch(
            "SELECT action FROM reaper.events WHERE kind = 'task' ORDER BY id"
        )
    ]
    assert actions == ["stopped", "replaced"]


async def test_orphans_are_unknown_handles_older_than_ttl(fleet):
    w = fleet.name("w")
    st = await fleet.beat(w, containers=["c-stray"])
    assert st.orphans == []
    await fleet.advance(TTL + 30, beating={w: {"containers": ["c-stray"]}})
    st = await fleet.state(w)
    assert st.orphans == ["c-stray"]
    await fleet.beat(w, containers=[])  # the agent destroyed it
    st = await fleet.state(w)
    assert st.orphans == []
