"""Rotating a host (CONTRACT.md §6): a drain that migrates, replacement first, says when the
host is empty, and answers. Time-skipping server; the fleet monitor runs (its upkeep moves
the work, every HEARTBEAT_INTERVAL, 10 s here); simulated hosts start what is placed on
them and remove their orphans (``tests/support/hosts.py``).

Invariants checked at every round (``Watch``): a service never above ``desired_count +
max_surge``; a running original never stopped before its replacement runs, unless at the
deadline; no task has two active replacements. And at the end: the service at
``desired_count``, each original replaced once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment

from reaper.core.contract import liveness_id
from tests.support.fleet import Fleet, fleet_with
from tests.support.hosts import Hosts, service_counts, tasks_of
from tests.support.polling import eventually
from tests.support.scheduler import setup_service
from tests.support.upgrade import sequence
from workflows.common import STATE_ATTR

HB = 10.0


@dataclass
class Watch:
    """The invariants of §6.1, checked after every round of beats."""

    pool: asyncpg.Pool
    service: str
    deadline_ok: bool = False
    """Stops at a drain's deadline are allowed (an original stopped before its
    replacement runs)."""
    highest: int = 0
    seen: list[str] = field(default_factory=list)

    async def __call__(self) -> None:
        desired, surge, active = await service_counts(self.pool, self.service)
        self.highest = max(self.highest, active)
        assert active <= desired + surge, (active, desired, surge)
        tasks = await tasks_of(self.pool, self.service)
        replacements: dict[str, list[str]] = {}
        for t in tasks.values():
            if t["replaces"] and t["state"] in ("pending", "running"):
                replacements.setdefault(t["replaces"], []).append(t["id"])
        assert all(len(r) == 1 for r in replacements.values()), replacements
        for t in tasks.values():
            if t["stop_reason"] == "drained":
                runs = [r for r in tasks.values() if r["replaces"] == t["id"]]
                assert any(r["state"] == "running" for r in runs), (t["id"], runs)
            if t["stop_reason"] == "drain-deadline":
                assert self.deadline_ok, t["id"]


async def drain(fleet: Fleet, worker: str, **payload: Any) -> dict[str, Any]:
    """The ``drain`` update (§6.3), as ``reaper drain`` sends it."""
    handle = fleet.client.get_workflow_handle(liveness_id(worker))
    answer: dict[str, Any] = await handle.execute_update("drain", {"actor": "ops", **payload})
    return answer


async def start_fleet(fleet: Fleet, pool: asyncpg.Pool, tasks: int, surge: int) -> Hosts:
    """Host ``w`` running ``tasks`` tasks of service ``web`` (desired ``tasks``, max_surge
    ``surge``); hosts ``x`` and ``y`` empty."""
    hosts = Hosts(fleet)
    w, x, y = fleet.name("w"), fleet.name("x"), fleet.name("y")
    ids = [f"web-{i}-{fleet.suffix}" for i in range(1, tasks + 1)]
    await setup_service(pool, f"web-{fleet.suffix}", {w: ids})
    await pool.execute(
        "UPDATE reaper.services SET max_surge = $2 WHERE name = $1", f"web-{fleet.suffix}", surge
    )
    await hosts.start(w)
    await hosts.start(x)
    await hosts.start(y)
    await hosts.run(2 * HB)  # w starts its tasks
    assert hosts.tasks[w] == set(ids)
    return hosts


async def test_a_migrating_drain_moves_every_task_replacement_first_and_says_drained(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool
) -> None:
    async with fleet_with(time_env, pool, monitor=True) as fleet:
        hosts = await start_fleet(fleet, pool, tasks=3, surge=1)
        w, service = fleet.names[0], f"web-{fleet.suffix}"
        watch = Watch(pool, service)
        answer = await drain(fleet, w, reason="rotate", migrate=True, deadline="30m")
        assert answer["accepted"] and answer["changed"] and answer["migrating"], answer
        assert answer["deadline"] is not None and not answer["drained"], answer
        await hosts.run(20 * HB, watch=watch)
        st = await fleet.state(w)
        assert st.drained and st.draining, st
        desc = await fleet.client.get_workflow_handle(liveness_id(w)).describe()
        assert desc.typed_search_attributes.get(STATE_ATTR) == "drained"  # the Web UI's
        assert hosts.tasks[w] == set()  # its agent removed the stopped originals
        tasks = await tasks_of(pool, service)
        originals = [t for t in tasks.values() if t["worker"] == w]
        assert {t["stop_reason"] for t in originals} == {"drained"}
        assert await service_counts(pool, service) == (3, 1, 3)
        assert watch.highest == 4  # one at a time (max_surge 1)
        row = await pool.fetchrow("SELECT drained_at FROM reaper.workers WHERE name = $1", w)
        assert row["drained_at"] is not None
        drained = await pool.fetch(
            "SELECT * FROM reaper.events WHERE worker = $1 AND action = 'drained'", w
        )
        assert len(drained) == 1
        replaced = await pool.fetch(
            "SELECT reason FROM reaper.events WHERE action = 'replaced' AND reason LIKE 'migrate%'"
            " AND reason LIKE $1",
            f"%drain of {w}%",
        )
        assert len(replaced) == 3


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        ({"migrate": "yes"}, "migrate"),
        ({"migrate": True, "deadline": "soon"}, "deadline"),
        ({"migrate": True, "deadline": "5s"}, "below 2 x HEARTBEAT_INTERVAL"),
    ],
)
async def test_a_bad_drain_is_refused_and_leaves_no_trace(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool, payload: dict[str, Any], why: str
) -> None:
    async with fleet_with(time_env, pool) as fleet:
        w = fleet.name("w")
        await fleet.beat(w, tasks=[])
        handle = fleet.client.get_workflow_handle(liveness_id(w))
        before = len(sequence(await handle.fetch_history()))
        with pytest.raises(WorkflowUpdateFailedError) as err:
            await handle.execute_update("drain", payload)
        assert why in str(err.value.cause), err.value.cause
        # No update event (the time-skipping server keeps the workflow task that ran the
        # validator; the dev server drops it, tests/e2e/test_rotate_cli.py).
        after = sequence(await handle.fetch_history())
        assert not [e for e in after[before:] if "UPDATE" in e], after[before:]
        assert not await pool.fetchval("SELECT draining FROM reaper.workers WHERE name = $1", w)


async def test_unknown_updates_and_unknown_workers_are_refused(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool
) -> None:
    async with fleet_with(time_env, pool) as fleet:
        w = fleet.name("w")
        await fleet.beat(w, tasks=[])
        handle = fleet.client.get_workflow_handle(liveness_id(w))
        with pytest.raises(WorkflowUpdateFailedError) as err:
            await handle.execute_update("quarantine", {"reason": "x"})
        assert "unknown update" in str(err.value.cause)
        # Any arity: extra arguments are ignored, as for signals.
        answer = await handle.execute_update("undrain", args=[{"reason": "x"}, 2, 3])
        assert answer["accepted"] and answer["changed"] is False
        await eventually(lambda: fleet.state(w), lambda s: s.state == "running", what="running")


async def until_pending_replacement(hosts: Hosts, pool: asyncpg.Pool, service: str) -> str:
    """Run rounds until a migration's replacement is placed and not yet running; its id."""

    async def pending() -> str | None:
        return await pool.fetchval(
            "SELECT id FROM reaper.tasks WHERE service = $1 AND replaces IS NOT NULL"
            " AND state = 'pending' AND worker IS NOT NULL",
            service,
        )

    for _ in range(6):
        await hosts.fleet.advance(HB)
        found = await pending()
        if found is not None:
            return found
        for w in sorted(hosts.tasks):
            if w not in hosts.silent:
                await hosts.beat(w)
    raise AssertionError("no replacement placed")


async def each_original_replaced_once(pool: asyncpg.Pool, service: str, worker: str) -> None:
    """Every task of ``worker`` is named by exactly one replacement, and the service is at
    its desired count."""
    tasks = await tasks_of(pool, service)
    for t in (t for t in tasks.values() if t["worker"] == worker):
        by = [r["id"] for r in tasks.values() if r["replaces"] == t["id"]]
        assert len(by) == 1, (t["id"], by, {k: dict(v) for k, v in tasks.items()})
    desired, _, active = await service_counts(pool, service)
    assert active == desired, {k: dict(v) for k, v in tasks.items()}


async def test_max_surge_moves_that_many_at_once(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool
) -> None:
    async with fleet_with(time_env, pool, monitor=True) as fleet:
        hosts = await start_fleet(fleet, pool, tasks=6, surge=3)
        w, service = fleet.names[0], f"web-{fleet.suffix}"
        watch = Watch(pool, service)
        await drain(fleet, w, migrate=True)
        await hosts.run(12 * HB, watch=watch)
        assert (await fleet.state(w)).drained
        assert watch.highest == 9  # three migrating at once, never more
        await each_original_replaced_once(pool, service, w)


async def test_no_capacity_waits_and_resumes_when_a_worker_comes(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool
) -> None:
    async with fleet_with(time_env, pool, monitor=True) as fleet:
        hosts = Hosts(fleet)
        w, service = fleet.name("w"), f"web-{fleet.suffix}"
        await setup_service(pool, service, {w: ["t1", "t2"]})
        await hosts.start(w)
        await hosts.run(2 * HB)
        watch = Watch(pool, service)
        await drain(fleet, w, migrate=True)
        await hosts.run(6 * HB, watch=watch)
        assert hosts.tasks[w] == {"t1", "t2"}  # nowhere to go: they keep running
        assert watch.highest == 2
        x = fleet.name("x")
        await hosts.start(x)
        came = await time_env.get_current_time()
        await hosts.run(2 * HB, watch=watch)
        placed = await pool.fetchval(
            "SELECT min(at) FROM reaper.events WHERE action = 'replaced' AND worker = $1", x
        )
        assert placed is not None and (placed - came).total_seconds() <= 2 * HB
        await hosts.run(8 * HB, watch=watch)
        assert (await fleet.state(w)).drained
        await each_original_replaced_once(pool, service, w)


@pytest.mark.parametrize(
    ("update", "reason", "state", "beats"),
    [("force_reap", "host gone", "lost", 6), ("retire", "scale-in", "retired", 4)],
    ids=["force-reaped", "retired"],
)
async def test_the_draining_worker_reaped_mid_migration_replaces_no_task_twice(
    time_env: WorkflowEnvironment,
    pool: asyncpg.Pool,
    update: str,
    reason: str,
    state: str,
    beats: int,
) -> None:
    """A worker force-reaped or retired while a replacement of its is pending: each of its
    tasks is replaced once, by the migration or by the reap, never by both."""
    async with fleet_with(time_env, pool, monitor=True) as fleet:
        hosts = await start_fleet(fleet, pool, tasks=3, surge=1)
        w, service = fleet.names[0], f"web-{fleet.suffix}"
        watch = Watch(pool, service)
        await drain(fleet, w, migrate=True)
        await until_pending_replacement(hosts, pool, service)
        hosts.silent.add(w)
        handle = fleet.client.get_workflow_handle(liveness_id(w))
        answer = await handle.execute_update(update, {"reason": reason})
        assert answer["accepted"] and answer["state"] == state, answer
        await hosts.run(beats * HB, watch=watch)
        await each_original_replaced_once(pool, service, w)


async def test_a_replacements_worker_lost_gets_another_replacement_and_the_original_runs_on(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool
) -> None:
    async with fleet_with(time_env, pool, monitor=True) as fleet:
        hosts = await start_fleet(fleet, pool, tasks=2, surge=1)
        w, x, _ = fleet.names
        service = f"web-{fleet.suffix}"
        watch = Watch(pool, service)
        await drain(fleet, w, migrate=True)
        first = await until_pending_replacement(hosts, pool, service)
        assert await pool.fetchval("SELECT worker FROM reaper.tasks WHERE id = $1", first) == x
        hosts.silent.add(x)  # x never starts it: lost after LOST_AFTER (300 s)
        await hosts.run(32 * HB, watch=watch)
        row = await pool.fetchrow("SELECT state, replaces FROM reaper.tasks WHERE id = $1", first)
        assert row["state"] == "lost"
        # Then both originals move to y, one after the other (about 3 rounds each).
        await hosts.run(10 * HB, watch=watch)
        assert (await fleet.state(w)).drained
        await each_original_replaced_once_or_more_after_a_loss(pool, service, w)


async def each_original_replaced_once_or_more_after_a_loss(
    pool: asyncpg.Pool, service: str, worker: str
) -> None:
    """Every task of ``worker`` stopped after one replacement ran; replacements that were
    lost before they ran do not count; the service is at its desired count."""
    tasks = await tasks_of(pool, service)
    for t in (t for t in tasks.values() if t["worker"] == worker):
        ran = [r for r in tasks.values() if r["replaces"] == t["id"] and r["state"] == "running"]
        assert t["stop_reason"] == "drained" and len(ran) == 1, (t["id"], ran)
    desired, _, active = await service_counts(pool, service)
    assert active == desired


async def test_undrain_mid_migration_ends_it_and_the_service_ends_at_its_desired_count(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool
) -> None:
    async with fleet_with(time_env, pool, monitor=True) as fleet:
        hosts = await start_fleet(fleet, pool, tasks=3, surge=1)
        w, service = fleet.names[0], f"web-{fleet.suffix}"
        watch = Watch(pool, service)
        await drain(fleet, w, migrate=True)
        await hosts.run(3 * HB, watch=watch)  # the first moved, the second placed
        pending = await until_pending_replacement(hosts, pool, service)
        handle = fleet.client.get_workflow_handle(liveness_id(w))
        answer = await handle.execute_update("undrain", {"reason": "rotation called off"})
        assert answer["accepted"] and answer["changed"] and not answer["migrating"], answer
        row = await pool.fetchrow(
            "SELECT state, stop_reason FROM reaper.tasks WHERE id = $1", pending
        )
        assert (row["state"], row["stop_reason"]) == ("stopped", "undrained")
        await hosts.run(6 * HB, watch=watch)
        desired, _, active = await service_counts(pool, service)
        assert active == desired == 3
        st = await fleet.state(w)
        assert not st.draining and not st.drained
        assert len(hosts.tasks[w]) in (1, 2)  # those not yet moved keep running there


async def test_at_the_deadline_what_is_left_stops_and_is_backfilled_once(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool
) -> None:
    async with fleet_with(time_env, pool, monitor=True) as fleet:
        hosts = Hosts(fleet)
        w, service = fleet.name("w"), f"web-{fleet.suffix}"
        await setup_service(pool, service, {w: ["t1", "t2"]})
        await pool.execute(
            "INSERT INTO reaper.tasks (id, worker, state) VALUES ('loner', $1, 'pending')", w
        )
        await hosts.start(w)
        await hosts.run(2 * HB)
        watch = Watch(pool, service, deadline_ok=True)
        await drain(fleet, w, migrate=True, deadline="40s")
        await hosts.run(6 * HB, watch=watch)  # no capacity: nothing moved before the deadline
        tasks = await tasks_of(pool, service)
        assert {tasks[t]["stop_reason"] for t in ("t1", "t2")} == {"drain-deadline"}
        loner = await pool.fetchrow("SELECT state, stop_reason FROM reaper.tasks WHERE id='loner'")
        assert (loner["state"], loner["stop_reason"]) == ("stopped", "drain-deadline")
        owed = [t for t in tasks.values() if t["state"] == "pending" and t["worker"] is None]
        assert sorted(t["replaces"] for t in owed) == ["t1", "t2"]  # backfilled, owed
        assert (await fleet.state(w)).drained
        x = fleet.name("x")
        await hosts.start(x)
        await hosts.run(3 * HB, watch=watch)
        await each_original_replaced_once(pool, service, w)


async def test_a_deadline_in_full_disruption_waits_for_the_fleet_to_recover(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool
) -> None:
    """Rule 6: like every automatic stop, the deadline's waits while the fleet is in full
    disruption (2 of 3 workers stalled here), and is carried out once it is not."""
    async with fleet_with(time_env, pool, monitor=True) as fleet:
        hosts = Hosts(fleet)
        w, a, b = fleet.name("w"), fleet.name("a"), fleet.name("b")
        service = f"web-{fleet.suffix}"
        await setup_service(pool, service, {w: ["t1"]})
        for h in (w, a, b):
            await hosts.start(h)
        await hosts.run(2 * HB)
        hosts.silent |= {a, b}
        await hosts.run(4 * HB)
        assert await pool.fetchval("SELECT state FROM reaper.fleet") == "full"
        await drain(fleet, w, migrate=True, deadline="20s")
        await hosts.run(6 * HB)  # the deadline passed 40 s ago
        t1 = await pool.fetchrow("SELECT state FROM reaper.tasks WHERE id = 't1'")
        assert t1["state"] == "running"
        hosts.silent -= {a, b}
        await hosts.run(3 * HB)
        assert await pool.fetchval("SELECT state FROM reaper.fleet") == "normal"
        t1 = await pool.fetchrow("SELECT state, stop_reason FROM reaper.tasks WHERE id = 't1'")
        assert tuple(t1) == ("stopped", "drain-deadline")
        await hosts.run(3 * HB)
        await each_original_replaced_once(pool, service, w)


async def test_a_service_cannot_be_given_a_max_surge_below_one(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool
) -> None:
    """Bad input (§6): ``max_surge`` below 1 is refused by its CHECK; nothing changes."""
    await pool.execute("INSERT INTO reaper.services (name, desired_count) VALUES ('s0', 1)")
    with pytest.raises(asyncpg.CheckViolationError):
        await pool.execute("UPDATE reaper.services SET max_surge = 0 WHERE name = 's0'")
    assert await pool.fetchval("SELECT max_surge FROM reaper.services WHERE name = 's0'") == 1


async def test_an_update_for_a_worker_that_never_beat_is_refused(
    time_env: WorkflowEnvironment, pool: asyncpg.Pool
) -> None:
    """A liveness started by a malformed first beat knows no worker yet: every operator
    update is refused (§6.3: an unknown worker), and changes nothing."""
    async with fleet_with(time_env, pool) as fleet:
        w = fleet.name("w")
        st = await fleet.raw(w, {"worker": w, "boot_id": "b", "seq": "not a number"})
        assert st.rejected == 1 and st.last_seq is None
        handle = fleet.client.get_workflow_handle(liveness_id(w))
        for name in ("drain", "force_reap", "retire", "undrain"):
            with pytest.raises(WorkflowUpdateFailedError) as err:
                await handle.execute_update(name, {"reason": "x"})
            assert "never sent a valid heartbeat" in str(err.value.cause), name
        assert await pool.fetchval("SELECT count(*) FROM reaper.workers WHERE name = $1", w) == 0
