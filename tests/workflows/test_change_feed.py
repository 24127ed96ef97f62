"""Change-driven diffs (CONTRACT.md §5.3 with the change feed, issue 11): an unchanged report
of unchanged rows is not diffed again, a change to the worker's rows is diffed on its next
report, and an unknown handle becomes an orphan on time, with no periodic resync at all.

Time-skipping server, with the fleet monitor (it reads the change feed). Timings: heartbeat
10 s, stalled after 30 s, lost after 300 s, MISSING_TTL 300 s, RESYNC_INTERVAL 30 s, and a
safety-net FULL_RESYNC_INTERVAL of 10,000 s, so that no diff here comes from it.
"""

from __future__ import annotations

from tests.support.fleet import fleet_with
from tests.support.scheduler import insert, rows

HB = 10
TTL = 300
RESYNC = 30
FEED = dict(full_resync_interval=10_000)


async def test_only_a_change_to_the_rows_gets_an_unchanged_report_diffed(time_env, pool):
    async with fleet_with(time_env, pool, monitor=True, **FEED) as fleet:
        a = fleet.name("a")
        await insert(pool, "containers", a, ["c-1"])
        report = {a: {"containers": ["c-1"]}}
        await fleet.beat(a, containers=["c-1"])
        await fleet.advance(3 * HB, beating=report)  # the insert above is fed back once
        settled = (await fleet.state(a)).forwarded_reports

        await fleet.advance(12 * HB, beating=report)  # 2 minutes, 4 RESYNC_INTERVALs
        assert (await fleet.state(a)).forwarded_reports == settled  # no diff: nothing changed

        await insert(pool, "containers", a, ["c-2"])  # the scheduler adds a row a lacks
        await fleet.advance(2 * HB, beating=report)  # §5.3: within RESYNC + 2 x HEARTBEAT
        marked = await rows(pool, "containers", a)
        assert marked["c-1"] is None and marked["c-2"] is not None
        assert (await fleet.state(a)).missing == 1


async def test_an_unknown_handle_becomes_an_orphan_without_a_resync(time_env, pool):
    async with fleet_with(time_env, pool, monitor=True, **FEED) as fleet:
        a = fleet.name("a")
        await insert(pool, "volumes", a, ["v-1"])
        report = {a: {"volumes": ["v-1", "stray"]}}
        await fleet.beat(a, volumes=["v-1", "stray"])
        await fleet.advance(TTL - 2 * HB, beating=report)
        assert (await fleet.state(a)).orphans == []  # unknown, not yet for MISSING_TTL
        await fleet.advance(4 * HB, beating=report)  # §5.3: within TTL + RESYNC + 2 x HB
        assert (await fleet.state(a)).orphans == ["stray"]
