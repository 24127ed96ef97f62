"""Metric 2: database writes per unchanged complete report, reaper vs a "last-seen" scheme.

``workers`` workers each hold ``rows`` containers in Postgres and report exactly those (plus
empty volume and task lists) every round. After a first report (the warm-up), ``rounds``
unchanged reports per worker go through Temporal and the controller; many are reconciled
against Postgres (its controller re-diffs them every 2 s, FULL_RESYNC_INTERVAL), the rest are
recognised as unchanged by their digest. reaper's writes are read from the rows themselves,
since the controller's backends flush their statistics on their own schedule: a row of any
table of schema ``reaper`` whose ``xmin`` is newer than the window's start was inserted or
updated in it, and row counts before and after give deletes; 0 rows found means 0 rows written
(a row updated twice counts once, so a non-zero count is a lower bound). The baseline is the
scheme that stamps every reported row (``UPDATE ... SET last_seen = now() WHERE handle =
ANY($1)``), run for the same reports on a copy of the rows in the same database and counted
with ``pg_stat_user_tables`` (its own backend, flushed with ``pg_stat_force_next_flush()``).
WAL bytes per report are shown too: reaper's row locks (``FOR SHARE``) and the fleet monitor
write WAL without writing rows.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
from temporalio.client import Client

from bench.common import forwarded, gather_limited, wait_settled
from bench.env import Controller
from bench.result import Metric, verdict
from reaper.kit.agents import SimAgent, send_heartbeat

LAST_SEEN = "UPDATE bench.last_seen SET last_seen = now() WHERE handle = ANY($1::text[])"


async def _tables(conn: asyncpg.Connection, schema: str) -> list[str]:
    return [
        r[0]
        for r in await conn.fetch(
            "SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables"
            " WHERE schemaname = $1 ORDER BY 1",
            schema,
        )
    ]


async def snapshot(conn: asyncpg.Connection, schema: str) -> tuple[int, dict[str, int], int]:
    """(xid at the start of the window, rows per table, WAL position in bytes)."""
    xid = await conn.fetchval("SELECT txid_current()")
    rows = {
        t: await conn.fetchval(f"SELECT count(*) FROM {t}") for t in await _tables(conn, schema)
    }
    lsn = await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    return xid, rows, int(lsn)


async def writes_since(
    conn: asyncpg.Connection, schema: str, snap: tuple[int, dict[str, int], int]
) -> tuple[int, dict[str, int], int]:
    """Row writes since ``snap``: (total, per table, WAL bytes)."""
    xid, before, lsn0 = snap
    per: dict[str, int] = {}
    for t in await _tables(conn, schema):
        new = await conn.fetchval(
            f"SELECT count(*) FROM {t} WHERE xmin::text::bigint >= $1", xid % (1 << 32)
        )
        now = await conn.fetchval(f"SELECT count(*) FROM {t}")
        deleted = max(0, before.get(t, 0) - now)
        if new or deleted:
            per[t] = new + deleted
    lsn = await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    return sum(per.values()), per, int(lsn) - lsn0


async def run(
    client: Client, ctl: Controller, workers: int, rows: int, rounds: int, interval: float
) -> Metric:
    pool = await asyncpg.create_pool(ctl.db_url, min_size=1, max_size=2)
    try:
        names = [f"steady-{i:04d}" for i in range(workers)]
        holdings = {n: [f"{n}-c{j:04d}" for j in range(rows)] for n in names}
        async with pool.acquire() as conn:
            await conn.copy_records_to_table(
                "containers",
                schema_name="reaper",
                columns=["handle", "worker", "state"],
                records=[(h, n, "created") for n in names for h in holdings[n]],
            )
            await conn.execute(
                "CREATE SCHEMA bench; CREATE TABLE bench.last_seen ("
                " handle text PRIMARY KEY, worker text NOT NULL,"
                " last_seen timestamptz)"
            )
            await conn.copy_records_to_table(
                "last_seen",
                schema_name="bench",
                columns=["handle", "worker"],
                records=[(h, n) for n in names for h in holdings[n]],
            )
            await conn.execute("VACUUM ANALYZE")
        sims = {
            n: SimAgent(n, lists={"containers": holdings[n], "volumes": [], "tasks": []})
            for n in names
        }

        async def round_() -> None:
            await gather_limited(
                (send_heartbeat(client, ctl.task_queue, sims[n].payload()) for n in names), 64
            )

        await round_()  # the first report: reconciled, nothing missing
        await wait_settled(client, {n: sims[n].seq - 1 for n in names}, timeout=120)
        fwd0 = await forwarded(client, names)
        async with pool.acquire() as conn:
            snap = await snapshot(conn, "reaper")
        for _ in range(rounds):
            began = time.monotonic()
            await round_()
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - began)))
        await wait_settled(client, {n: sims[n].seq - 1 for n in names}, timeout=120)
        reconciled = await forwarded(client, names) - fwd0
        async with pool.acquire() as conn:
            total, per, wal = await writes_since(conn, "reaper", snap)
            reports = workers * rounds
            # The baseline, same reports, same counting; its own backend flushes its stats.
            await conn.execute("SELECT pg_stat_force_next_flush()")
            stat0 = await conn.fetchval(
                "SELECT n_tup_upd + n_tup_ins + n_tup_del FROM pg_stat_user_tables"
                " WHERE schemaname = 'bench' AND relname = 'last_seen'"
            )
            snap_ls = await snapshot(conn, "bench")
            for _ in range(rounds):
                for n in names:
                    await conn.execute(LAST_SEEN, holdings[n])
            ls_total, _, ls_wal = await writes_since(conn, "bench", snap_ls)
            await conn.execute("SELECT pg_stat_force_next_flush()")
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            stat1 = await conn.fetchval(
                "SELECT n_tup_upd + n_tup_ins + n_tup_del FROM pg_stat_user_tables"
                " WHERE schemaname = 'bench' AND relname = 'last_seen'"
            )
        per_report = total / reports
        ls_versions = stat1 - stat0  # row versions written, from its own flushed statistics
        ls_per_report = ls_versions / reports
        details = [
            f"{workers} workers x {rounds} unchanged reports ({rows} containers each, plus "
            f"empty volume and task lists, plain v1 beats) = {reports} reports; {reconciled} "
            f"kind-reports reconciled against Postgres (full resync every 2 s), the rest skipped "
            "by digest",
            f"reaper: {total} rows written"
            + (f" ({per})" if per else "")
            + f"; {wal / reports:.0f} WAL bytes per report (row locks, fleet monitor)",
            f"last-seen: {ls_versions} row versions written (pg_stat_user_tables n_tup_upd), "
            f"{ls_total} distinct rows rewritten (xmin); {ls_wal / reports:.0f} WAL bytes per "
            "report",
        ]
        m = Metric(
            "2",
            f"{per_report:g} vs {ls_per_report:g} rows written per report (last-seen)",
            "0 vs N",
            verdict(total == 0),
            details,
        )
        if total:
            m.why = f"unchanged reports wrote rows: {per}"
        return m
    finally:
        await pool.close()
