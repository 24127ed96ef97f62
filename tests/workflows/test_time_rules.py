"""Time that nothing forgets: every rule that can become true by time alone
(``reaper.core.policy.time_rules.TIME_RULES``) fires within its bound, with the full resync
switched off (FULL_RESYNC_INTERVAL of 10^6 s), so no rule rides on a periodic pass.

One scenario per timed rule; a rule without one fails :func:`test_every_timed_rule_has_a_scenario`.
Each scenario checks the rule has not fired just before it is due, then that it has fired by
its bound. Time-skipping server with the fleet monitor (the change feed). Timings below; the
liveness's rules are proven on its clock, the collector's on the report after the due time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest
from temporalio.testing import WorkflowEnvironment

from reaper.core.models import Timings
from reaper.core.policy.time_rules import TIME_RULES, TimeRule, timed
from tests.support.controller import make_settings
from tests.support.fleet import Fleet, fleet_with
from tests.support.polling import eventually
from tests.support.scheduler import insert, rows, setup_service, task_states
from workflows.common import liveness_id

HB, STALL, LOST, TTL, CREATING, RETIRE = 10, 30, 60, 30, 60, 120
TIMINGS: dict[str, Any] = dict(
    heartbeat_interval=HB,
    stall_after=STALL,
    lost_after=LOST,
    missing_ttl=TTL,
    resync_interval=30,
    full_resync_interval=1_000_000,
    creating_timeout=CREATING,
    retire_after=RETIRE,
)
T = Timings.of(make_settings(**TIMINGS))
RULES = {rule.name: rule for rule in TIME_RULES}
PROVEN_ELSEWHERE = {
    "repair": "tests/e2e/test_repair.py",
    "outage-grace": "tests/e2e/test_outage.py",
}
"""Rules whose timer needs a real fault to show (a stuck liveness, a controller down while
the server's clock runs on): their end-to-end tests. The time-skipping server skips no time
while a workflow task waits for a controller that is down."""


def bound(name: str) -> float:
    return RULES[name].bound(T)


async def now(fleet: Fleet) -> datetime:
    return await fleet.env.get_current_time()


async def worker_state(pool: asyncpg.Pool, worker: str) -> str | None:
    return await pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", worker)


async def until_state(pool: asyncpg.Pool, worker: str, state: str) -> None:
    await eventually(lambda: worker_state(pool, worker), lambda s: s == state, what=state)


async def advance_to(fleet: Fleet, at: datetime, beating: dict[str, dict[str, Any]]) -> None:
    """Let time pass until ``at`` (UTC), the ``beating`` workers beating every interval."""
    left = (at - await now(fleet)).total_seconds()
    if left > 0:
        await fleet.advance(left, beating=beating, step=HB)


Scenario = Callable[[WorkflowEnvironment, asyncpg.Pool], Awaitable[None]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        assert name in RULES, f"no time rule {name!r}"
        SCENARIOS[name] = fn
        return fn

    return register


@scenario("stall")
async def _stall(env: WorkflowEnvironment, pool: asyncpg.Pool) -> None:
    async with fleet_with(env, pool, monitor=True, **TIMINGS) as fleet:
        w = fleet.name("w")
        beat = await fleet.beat(w)
        assert beat.last_heartbeat_at is not None  # the liveness's time of the beat
        due = beat.last_heartbeat_at + timedelta(seconds=STALL)
        await advance_to(fleet, due - timedelta(seconds=1), {})
        assert (await fleet.state(w)).state == "running"
        await advance_to(fleet, due + timedelta(seconds=bound("stall")), {})
        await until_state(pool, w, "stalled")


@scenario("lost")
async def _lost(env: WorkflowEnvironment, pool: asyncpg.Pool) -> None:
    async with fleet_with(env, pool, monitor=True, **TIMINGS) as fleet:
        w, others = fleet.name("w"), [fleet.name(f"o{i}") for i in range(2)]
        await setup_service(pool, "svc", {w: ["t-1"]})
        beat = await fleet.beat(w, tasks=["t-1"])
        assert beat.last_heartbeat_at is not None
        # From the liveness's time of w's beat: the others' beats take real time, which the
        # server's clock counts (at load 14 more than the second kept before the due time:
        # w was lost when the test read the clock after them and looked 1 s early).
        due = beat.last_heartbeat_at + timedelta(seconds=LOST)
        for o in others:
            await fleet.beat(o)
        beating: dict[str, dict[str, Any]] = {o: {} for o in others}
        await advance_to(fleet, due - timedelta(seconds=1), beating)
        assert (await fleet.state(w)).state == "stalled"
        await advance_to(fleet, due + timedelta(seconds=bound("lost")), {})
        await until_state(pool, w, "lost")
        await eventually(
            lambda: task_states(pool), lambda t: t["t-1"][1] == "lost", what="t-1 reaped"
        )


@scenario("reap-retry")
async def _reap_retry(env: WorkflowEnvironment, pool: asyncpg.Pool) -> None:
    """Two workers lost at once with one reap token (a token every 50 s): the second reap is
    refused and retried when its token is due."""
    async with fleet_with(
        env, pool, monitor=True, reap_rate=0.02, reap_burst=1, **TIMINGS
    ) as fleet:
        a, b = fleet.name("a"), fleet.name("b")
        others = [fleet.name(f"o{i}") for i in range(3)]
        await setup_service(pool, "svc", {a: ["t-a"], b: ["t-b"]})
        await pool.execute("UPDATE reaper.tasks SET state = 'running'")
        await fleet.beat(a, tasks=["t-a"])
        await fleet.beat(b, tasks=["t-b"])
        beating: dict[str, dict[str, Any]] = {o: {} for o in others}
        for o in others:
            await fleet.beat(o)
        lost_at = await now(fleet) + timedelta(seconds=LOST)
        await advance_to(fleet, lost_at + timedelta(seconds=2 * bound("lost")), beating)
        reaped = [t for t, v in (await task_states(pool)).items() if v[1] == "lost"]
        assert len(reaped) == 1, "a burst of 1 reaped both"
        token = lost_at + timedelta(seconds=50)
        await advance_to(fleet, token - timedelta(seconds=5), beating)
        assert len([t for t, v in (await task_states(pool)).items() if v[1] == "lost"]) == 1
        await advance_to(fleet, token + timedelta(seconds=bound("reap-retry") + 1), beating)
        await eventually(
            lambda: task_states(pool),
            lambda t: t["t-a"][1] == t["t-b"][1] == "lost",
            what="the second reap, on its token",
        )


@scenario("retire-after")
async def _retire_after(env: WorkflowEnvironment, pool: asyncpg.Pool) -> None:
    async with fleet_with(env, pool, monitor=True, **TIMINGS) as fleet:
        w, o = fleet.name("w"), fleet.name("o")
        await fleet.beat(w)
        await fleet.beat(o)
        beating: dict[str, dict[str, Any]] = {o: {}}
        lost_at = await now(fleet) + timedelta(seconds=LOST)
        await advance_to(fleet, lost_at + timedelta(seconds=HB), beating)
        await until_state(pool, w, "lost")
        since = await pool.fetchval("SELECT state_since FROM reaper.workers WHERE name = $1", w)
        due = since + timedelta(seconds=RETIRE)
        await advance_to(fleet, due - timedelta(seconds=2), beating)
        assert await worker_state(pool, w) == "lost"
        await advance_to(fleet, due + timedelta(seconds=bound("retire-after")), beating)
        await until_state(pool, w, "retired")


@scenario("retire-retry")
async def _retire_retry(env: WorkflowEnvironment, pool: asyncpg.Pool) -> None:
    """An automatic retirement that falls due in full disruption is refused, and tried again
    STALL_AFTER later: it happens then, once the fleet has recovered."""
    async with fleet_with(env, pool, monitor=True, **TIMINGS) as fleet:
        w = fleet.name("w")
        others = [fleet.name(f"o{i}") for i in range(3)]
        await fleet.beat(w)
        for o in others:
            await fleet.beat(o)
        everyone: dict[str, dict[str, Any]] = {o: {} for o in others}
        await advance_to(fleet, await now(fleet) + timedelta(seconds=LOST + HB), everyone)
        await until_state(pool, w, "lost")
        since = await pool.fetchval("SELECT state_since FROM reaper.workers WHERE name = $1", w)
        due = since + timedelta(seconds=RETIRE)
        # Two of the others fall silent: 3 of 4 unhealthy, full disruption at the due time.
        few: dict[str, dict[str, Any]] = {others[0]: {}}
        await advance_to(fleet, due + timedelta(seconds=bound("retire-after")), few)
        assert await worker_state(pool, w) == "lost", "retired in full disruption"
        for o in others[1:]:
            await fleet.beat(o)  # back: the fleet recovers
        retry = due + timedelta(seconds=STALL)
        await advance_to(fleet, retry + timedelta(seconds=bound("retire-retry") + HB), everyone)
        await until_state(pool, w, "retired")


@scenario("missing-ttl")
async def _missing_ttl(env: WorkflowEnvironment, pool: asyncpg.Pool) -> None:
    async with fleet_with(env, pool, monitor=True, **TIMINGS) as fleet:
        w = fleet.name("w")
        await insert(pool, "volumes", w, ["v-1", "v-2"])
        await fleet.beat(w, volumes=["v-1", "v-2"])
        await fleet.beat(w, volumes=["v-1"])
        marked = (await rows(pool, "volumes", w))["v-2"]
        assert marked is not None
        due = marked + timedelta(seconds=TTL)
        report: dict[str, dict[str, Any]] = {w: {"volumes": ["v-1"]}}
        await advance_to(fleet, due - timedelta(seconds=1), report)
        assert "v-2" in await rows(pool, "volumes", w)
        await advance_to(fleet, due + timedelta(seconds=bound("missing-ttl")), report)
        assert set(await rows(pool, "volumes", w)) == {"v-1"}


@scenario("destroy-retry")
async def _destroy_retry(env: WorkflowEnvironment, pool: asyncpg.Pool) -> None:
    """A destroy that falls due in full disruption is refused and tried again STALL_AFTER
    later, when it happens (the fleet recovered meanwhile)."""
    async with fleet_with(env, pool, monitor=True, **TIMINGS) as fleet:
        w, b, c = fleet.name("w"), fleet.name("b"), fleet.name("c")
        await insert(pool, "containers", w, ["c-1", "c-2"])
        await fleet.beat(w, containers=["c-1", "c-2"])
        for o in (b, c):
            await fleet.beat(o)
        # b and c fall silent now: stalled (2 of 3 unhealthy: full disruption) well
        # before c-2, dropped one interval later, falls due.
        await fleet.advance(HB, beating={w: {"containers": ["c-1", "c-2"]}})
        await fleet.beat(w, containers=["c-1"])
        due = (await rows(pool, "containers", w))["c-2"] + timedelta(seconds=TTL)
        alone: dict[str, dict[str, Any]] = {w: {"containers": ["c-1"]}}
        await advance_to(fleet, due + timedelta(seconds=bound("missing-ttl")), alone)
        assert "c-2" in await rows(pool, "containers", w), "destroyed in full disruption"
        for o in (b, c):
            await fleet.beat(o)
        everyone = {**alone, b: {}, c: {}}
        # Refused on the first report after the due time (within one interval), tried again
        # STALL_AFTER after the refusal.
        await advance_to(fleet, due + timedelta(seconds=STALL - 1), everyone)
        assert "c-2" in await rows(pool, "containers", w), "tried again before STALL_AFTER"
        retry = due + timedelta(seconds=HB + STALL)
        await advance_to(fleet, retry + timedelta(seconds=bound("destroy-retry")), everyone)
        assert set(await rows(pool, "containers", w)) == {"c-1"}


@scenario("orphan")
async def _orphan(env: WorkflowEnvironment, pool: asyncpg.Pool) -> None:
    async with fleet_with(env, pool, monitor=True, **TIMINGS) as fleet:
        w = fleet.name("w")
        first = await fleet.beat(w, volumes=["stray"])
        # Due TTL after the report that first held it was taken (the beat's time, which the
        # server's clock has passed by the time a test reads it: under load by over 1 s).
        assert first.last_heartbeat_at is not None
        due = first.last_heartbeat_at + timedelta(seconds=TTL)
        report: dict[str, dict[str, Any]] = {w: {"volumes": ["stray"]}}
        await advance_to(fleet, due - timedelta(seconds=1), report)
        assert (await fleet.state(w)).orphans == []
        await advance_to(fleet, due + timedelta(seconds=bound("orphan")), report)
        assert (await fleet.state(w)).orphans == ["stray"]


@scenario("creating-timeout")
async def _creating_timeout(env: WorkflowEnvironment, pool: asyncpg.Pool) -> None:
    """Rows whose create never reached the worker (the creator crashed) are failed and
    collected CREATING_TIMEOUT after they were inserted, on an unchanged report."""
    async with fleet_with(env, pool, monitor=True, **TIMINGS) as fleet:
        w = fleet.name("w")
        await fleet.beat(w, containers=[], volumes=[])
        at = await now(fleet)
        await insert(pool, "containers", w, ["c-new"], state="creating", at=at)
        await insert(pool, "volumes", w, ["v-new"], state="creating", at=at)
        report: dict[str, dict[str, Any]] = {w: {"containers": [], "volumes": []}}
        due = at + timedelta(seconds=CREATING)
        await advance_to(fleet, due - timedelta(seconds=1), report)
        assert "c-new" in await rows(pool, "containers", w)
        await advance_to(fleet, due + timedelta(seconds=bound("creating-timeout")), report)
        assert await rows(pool, "containers", w) == {} and await rows(pool, "volumes", w) == {}
        reasons = await pool.fetch(
            "SELECT handle, reason FROM reaper.events WHERE action = 'destroyed' AND worker = $1"
            " ORDER BY handle",
            w,
        )
        assert [tuple(r) for r in reasons] == [
            ("c-new", "creating-timeout"),
            ("v-new", "creating-timeout"),
        ]


@scenario("owed-work")
async def _owed_work(env: WorkflowEnvironment, pool: asyncpg.Pool) -> None:
    async with fleet_with(env, pool, monitor=True, **TIMINGS) as fleet:
        w, d, n = fleet.name("w"), fleet.name("d"), fleet.name("n")
        await setup_service(pool, "svc", {w: ["t-1"]})
        await fleet.beat(w, tasks=["t-1"])
        await fleet.beat(d)  # healthy but draining: no disruption, and no place for work
        await fleet.client.get_workflow_handle(liveness_id(d)).signal("drain", {"reason": "x"})
        await advance_to(fleet, await now(fleet) + timedelta(seconds=LOST + 2 * HB), {d: {}})
        owed = "SELECT count(*) FROM reaper.tasks WHERE worker IS NULL AND state = 'pending'"
        assert await pool.fetchval(owed) == 1
        await fleet.beat(n)  # a placeable worker appears
        joined = await now(fleet)
        await advance_to(fleet, joined + timedelta(seconds=bound("owed-work")), {n: {}, d: {}})
        assert await pool.fetchval(owed) == 0
        placed = "SELECT count(*) FROM reaper.tasks WHERE worker = $1 AND state = 'pending'"
        assert await pool.fetchval(placed, n) == 1


@scenario("strays")
async def _strays(env: WorkflowEnvironment, pool: asyncpg.Pool) -> None:
    async with fleet_with(env, pool, monitor=True, **TIMINGS) as fleet:
        w, o = fleet.name("w"), fleet.name("o")
        await pool.execute("INSERT INTO reaper.services (name, desired_count) VALUES ('s', 1)")
        await fleet.beat(w)
        await fleet.beat(o)
        await advance_to(fleet, await now(fleet) + timedelta(seconds=LOST + 2 * HB), {o: {}})
        await until_state(pool, w, "lost")
        await pool.execute(
            "INSERT INTO reaper.tasks (id, service, worker, state) VALUES ('s-1', 's', $1,"
            " 'running')",
            w,
        )
        written = await now(fleet)
        await advance_to(fleet, written + timedelta(seconds=bound("strays")), {o: {}})
        assert (await task_states(pool))["s-1"][1:3] == ("lost", "worker-lost")


@scenario("change-feed")
async def _change_feed(env: WorkflowEnvironment, pool: asyncpg.Pool) -> None:
    async with fleet_with(env, pool, monitor=True, **TIMINGS) as fleet:
        w = fleet.name("w")
        await insert(pool, "containers", w, ["c-1"])
        report: dict[str, dict[str, Any]] = {w: {"containers": ["c-1"]}}
        await fleet.beat(w, containers=["c-1"])
        await advance_to(fleet, await now(fleet) + timedelta(seconds=3 * HB), report)
        await insert(pool, "containers", w, ["c-2"])  # a row the worker does not report
        written = await now(fleet)
        bound_s = T.resync_interval + 2 * HB  # §5.3, within the monitor's bound
        assert bound("change-feed") <= bound_s
        await advance_to(fleet, written + timedelta(seconds=bound("change-feed") + HB), report)
        assert (await rows(pool, "containers", w))["c-2"] is not None


async def test_every_timed_rule_has_a_scenario() -> None:
    """A new time rule needs a scenario here (or an end-to-end test named in
    :data:`PROVEN_ELSEWHERE`), and every rule without a timer says why."""
    names = {rule.name for rule in timed()}
    assert names == set(SCENARIOS) | set(PROVEN_ELSEWHERE)
    assert not set(SCENARIOS) & set(PROVEN_ELSEWHERE)
    for rule in TIME_RULES:
        if rule.timer is None:
            assert rule.fires.startswith("no timer:"), rule.name
    assert len({rule.name for rule in TIME_RULES}) == len(TIME_RULES)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_a_time_rule_fires_within_its_bound(name: str, time_env, pool) -> None:
    rule: TimeRule = RULES[name]
    assert rule.timer is not None
    await SCENARIOS[name](time_env, pool)
