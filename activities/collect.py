"""Report garbage collection: mark, clear and destroy missing handles (CONTRACT.md rules 1-4).

The verbs follow Concourse's ``atc/db`` (``UpdateContainersMissingSince``,
``RemoveMissingContainers``): each statement is guarded by the state it expects, so a race
or a retry turns into "0 rows", never into harm, and only rows whose ``missing_since``
actually changes are written. In a dry run the same verbs keep their marks in
``reaper.dry_marks`` and write ``would-`` events, leaving the user's rows untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg
from temporalio import activity

from activities.base import EVENT_KIND, ActivityBase, per_kind, unique, write_events
from activities.placement import backfill
from activities.types import DestroyInput, DestroyResult, ReconcileInput, ReconcileResult
from reaper.core.models import KindStatus

MARKABLE = {
    "containers": ["created", "destroying"],
    "volumes": ["created", "destroying"],
    "tasks": ["running"],
}
"""States whose rows may be marked missing (rule 2: never ``creating``, never ``pending``)."""

REPORT = "pg_temp.reaper_report"
"""The report being reconciled: a temporary table of the connection, emptied at commit.

The report is sent to Postgres once (COPY, or straight from ``reaper.report_chunks`` when it
was staged) and every statement joins against it; shipping a 100,000-handle array to each
statement cost four times the transfer and parse (BENCHMARKS.md, metric 3a)."""
_CREATE_REPORT = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {REPORT.split('.')[1]} (h text NOT NULL)"
    " ON COMMIT DELETE ROWS"
)
_IN_REPORT = f"IN (SELECT h FROM {REPORT})"

# Rows of the worker absent from the report, markable, whose state was set before the
# report was taken (rule 2). $2 taken_at, $3 markable states.
_ABSENT = (
    "FROM {table} t WHERE t.worker = $1 AND t.state = ANY($3::text[])"
    " AND t.state_changed_at <= $2"
    f" AND NOT EXISTS (SELECT 1 FROM {REPORT} r WHERE r.h = t.{{key}})"
)


@dataclass(frozen=True)
class MarkStore:
    """Where marks live: ``missing_since`` on the rows, or ``reaper.dry_marks`` in a dry run.

    Each attribute is one statement per kind. Parameters: $1 worker, then as noted; the
    report itself is the table ``REPORT``.
    """

    clear: dict[str, str]      # reported handles -> rows cleared
    restart: dict[str, str]    # $2 also_seen, $3 taken_at
    mark: dict[str, str]       # $2 taken_at, $3 markable -> handles marked
    status: dict[str, str]     # -> n, oldest (not yet destroyed)
    held: dict[str, str]       # $2 markable -> rows a report could drop
    restart_all: dict[str, str]  # $2 taken_at: every mark of the kind restarts


_HELD = per_kind("SELECT count(*) FROM {table} WHERE worker = $1 AND state = ANY($2::text[])")

ROWS = MarkStore(
    clear=per_kind(
        "UPDATE {table} SET missing_since = NULL"
        " WHERE worker = $1 AND missing_since IS NOT NULL AND {key} " + _IN_REPORT
    ),
    # Marked rows that a superseded report still held were seen after their mark: their
    # clock restarts (rule 4: every report since missing_since must lack the handle).
    restart=per_kind(
        "UPDATE {table} SET missing_since = $3"
        " WHERE worker = $1 AND missing_since IS NOT NULL AND missing_since < $3"
        " AND {key} = ANY($2::text[])"
    ),
    mark=per_kind(
        "UPDATE {table} AS u SET missing_since = $2 FROM (SELECT t.{key} AS k "
        + _ABSENT + " AND t.missing_since IS NULL) AS m WHERE u.{key} = m.k RETURNING u.{key}"
    ),
    status=per_kind(
        "SELECT count(*) AS n, min(missing_since) AS oldest FROM {table}"
        " WHERE worker = $1 AND missing_since IS NOT NULL"
    ),
    held=_HELD,
    restart_all=per_kind(
        "UPDATE {table} SET missing_since = $2"
        " WHERE worker = $1 AND missing_since IS NOT NULL AND missing_since < $2"
    ),
)


def _dry(template: str) -> dict[str, str]:
    return {
        k: v.replace("{kind}", k)
        for k, v in per_kind(template).items()
    }


DRY = MarkStore(
    clear=_dry(
        "DELETE FROM reaper.dry_marks"
        " WHERE worker = $1 AND kind = '{kind}' AND handle " + _IN_REPORT
    ),
    restart=_dry(
        "UPDATE reaper.dry_marks SET missing_since = $3, done = false"
        " WHERE worker = $1 AND kind = '{kind}' AND missing_since < $3"
        " AND handle = ANY($2::text[])"
    ),
    mark=_dry(
        "INSERT INTO reaper.dry_marks (worker, kind, handle, missing_since)"
        " SELECT $1, '{kind}', t.{key}, $2 " + _ABSENT
        + " ON CONFLICT DO NOTHING RETURNING handle"
    ),
    status=_dry(
        "SELECT count(*) AS n, min(missing_since) FILTER (WHERE NOT done) AS oldest"
        " FROM reaper.dry_marks d WHERE worker = $1 AND kind = '{kind}'"
        " AND EXISTS (SELECT 1 FROM {table} t WHERE t.{key} = d.handle AND t.worker = $1)"
    ),
    held=_HELD,
    restart_all=_dry(
        "UPDATE reaper.dry_marks SET missing_since = $2, done = false"
        " WHERE worker = $1 AND kind = '{kind}' AND missing_since < $2"
    ),
)

# Reported handles the database does not hold for this worker: remember when first seen,
# forget those no longer reported; the ones older than MISSING_TTL are orphans.
_UNKNOWN = per_kind(
    f"WITH u AS (SELECT r.h FROM {REPORT} r"
    "  WHERE NOT EXISTS (SELECT 1 FROM {table} t WHERE t.{key} = r.h AND t.worker = $1)),"
    " ins AS (INSERT INTO reaper.unknown_handles (worker, kind, handle, first_seen)"
    "  SELECT $1, $2, h, $3 FROM u ON CONFLICT DO NOTHING),"
    " del AS (DELETE FROM reaper.unknown_handles x WHERE x.worker = $1 AND x.kind = $2"
    "  AND NOT EXISTS (SELECT 1 FROM u WHERE u.h = x.handle))"
    " SELECT x.handle FROM reaper.unknown_handles x JOIN u ON u.h = x.handle"
    " WHERE x.worker = $1 AND x.kind = $2 AND x.first_seen <= $4 ORDER BY x.handle"
)
_DESTROY = {
    kind: (
        f"DELETE FROM {table} WHERE worker = $1 AND missing_since IS NOT NULL"
        " AND missing_since <= $2 AND state = ANY($3::text[])"
        " RETURNING handle, NULL::text AS service, missing_since"
    )
    for kind, table in (("containers", "reaper.containers"), ("volumes", "reaper.volumes"))
}
_DESTROY["tasks"] = (
    "UPDATE reaper.tasks SET state = 'stopped', stop_reason = 'missing', missing_since = NULL"
    " WHERE worker = $1 AND missing_since IS NOT NULL AND missing_since <= $2"
    " AND state = ANY($3::text[]) RETURNING id AS handle, service, $2::timestamptz AS missing_since"
)
_WOULD_DESTROY = {
    kind: sql.replace("{service}", "t.service" if kind == "tasks" else "NULL::text")
    for kind, sql in _dry(
        "UPDATE reaper.dry_marks d SET done = true FROM {table} t"
        " WHERE d.worker = $1 AND d.kind = '{kind}' AND NOT d.done AND d.missing_since <= $2"
        " AND t.{key} = d.handle AND t.worker = $1 AND t.state = ANY($3::text[])"
        " RETURNING d.handle, {service} AS service, d.missing_since"
    ).items()
}
# Rows left in `creating` past CREATING_TIMEOUT: their creator crashed (issue 3, rule 1).
_STUCK_CREATING = {
    kind: (
        f"DELETE FROM {table} WHERE worker = $1 AND state = 'creating'"
        " AND state_changed_at <= $2 RETURNING handle"
    )
    for kind, table in (("containers", "reaper.containers"), ("volumes", "reaper.volumes"))
}
_WOULD_STUCK_CREATING = {
    kind: (
        f"SELECT handle FROM {table} WHERE worker = $1 AND state = 'creating'"
        " AND state_changed_at <= $2"
    )
    for kind, table in (("containers", "reaper.containers"), ("volumes", "reaper.volumes"))
}


class _TooMany(Exception):
    """A report would mark more than the mass-drop rule allows (rolls its marks back)."""


async def _load_report(conn: asyncpg.Connection, inp: ReconcileInput) -> bool:
    """Put the report's distinct handles in ``REPORT`` (inside the caller's transaction).

    A staged report is copied within Postgres from ``reaper.report_chunks``; an inline one
    is sent once by COPY. Returns False if a staged report is gone.
    """
    await conn.execute(_CREATE_REPORT)
    if inp.staged is not None:
        found = await conn.fetchval(
            "WITH c AS (SELECT handles FROM reaper.report_chunks WHERE worker = $1"
            " AND kind = $2 AND report_id = $3),"
            f" ins AS (INSERT INTO {REPORT} (h) SELECT DISTINCT unnest(handles) FROM c)"
            " SELECT count(*) FROM c",
            inp.worker, inp.kind, inp.staged,
        )
        return found > 0
    await conn.copy_records_to_table(
        REPORT.split(".")[1], schema_name="pg_temp", columns=["h"],
        records=[(h,) for h in unique(inp.handles)],
    )
    return True


class CollectActivities(ActivityBase):
    """Activities called by ``HandleCollector`` (one collector per worker, ``gc-{worker}``)."""

    @activity.defn(name="reconcile_report")
    async def reconcile_report(self, inp: ReconcileInput) -> ReconcileResult:
        """Diff a complete report against the worker's rows: mark newly missing, clear returned.

        Only a ``running`` worker's report marks or clears (rule 1), and only one taken since
        its latest return (rule 4: a report from before a stall never decides); ``creating``
        rows and rows that changed state after ``taken_at`` are never marked (rule 2); rows whose
        ``missing_since`` would not change are not written (rule 3). For tasks, a ``pending``
        task placed on the worker that it reports becomes ``running`` (rule 5), and reported
        tasks that were reaped are orphans (rule 7). A report that would drop more than
        ``max_drop_fraction`` of the worker's handles at once marks nothing (``suspect``)
        unless ``confirmed``. Rows stuck in ``creating`` past ``creating_timeout`` are
        deleted with an event. Idempotent: a rerun of the same report changes nothing more.

        Args:
            inp: ``handles`` is the complete list; ``taken_at`` the controller's UTC receive
                time, which becomes ``missing_since`` of rows newly marked.
        """
        kind, worker, dry = inp.kind, inp.worker, inp.dry_run
        store = DRY if dry else ROWS
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT state, state_since FROM reaper.workers WHERE name = $1 FOR SHARE", worker
            )
            state = row["state"] if row else None
            if state != "running":
                return ReconcileResult(skipped=f"worker is {state or 'unknown'}")
            if row["state_since"] is not None and inp.taken_at < row["state_since"]:
                # Taken before the worker's latest return: time away does not count, and the
                # first report after the return decides (rule 4).
                return ReconcileResult(skipped=f"report taken before the return at "
                                               f"{row['state_since'].isoformat()}")
            if not await _load_report(conn, inp):
                return ReconcileResult(skipped=f"staged report {inp.staged} is gone")
            result = ReconcileResult()
            if kind == "tasks" and not dry:
                result.started = await _column(
                    conn,
                    "UPDATE reaper.tasks SET state = 'running' WHERE worker = $1"
                    " AND state = 'pending' AND id " + _IN_REPORT + " RETURNING id",
                    worker,
                )
            # The report is an array parameter, which the planner guesses at 10 rows: left to
            # itself it diffs a 100,000-handle report by nested loop, O(rows x handles).
            # Hash joins while the worker's rows are diffed against the report; index probes
            # (nested loops) again when the report is looked up in the table.
            await conn.execute("SET LOCAL enable_nestloop = off")
            result.cleared = _count(await conn.execute(store.clear[kind], worker))
            if inp.also_seen:
                await conn.execute(store.restart[kind], worker, inp.also_seen, inp.taken_at)
            if inp.restart_all:
                await conn.execute(store.restart_all[kind], worker, inp.taken_at)
            marked = await self._mark(conn, store, inp, result)
            if dry:
                await write_events(
                    conn, worker, EVENT_KIND[kind], "mark", marked, "missing from report",
                    dry_run=True,
                    dedupe=[f"mark:{worker}:{kind}:{h}:{inp.taken_at.isoformat()}" for h in marked],
                )
            if kind != "tasks":
                await self._collect_stuck_creating(conn, inp)
            cutoff = inp.taken_at - timedelta(seconds=inp.missing_ttl)
            result.status = await _status(conn, store, worker, kind, inp.missing_ttl)
            await conn.execute("SET LOCAL enable_nestloop = on")
            orphans = await _column(conn, _UNKNOWN[kind], worker, kind, inp.taken_at, cutoff)
            if kind == "tasks":
                reaped = await _column(
                    conn,
                    "SELECT id FROM reaper.tasks WHERE worker = $1"
                    " AND state IN ('lost', 'stopped') AND id " + _IN_REPORT,
                    worker,
                )
                orphans = sorted({*orphans, *reaped})
                result.assignments = await _column(
                    conn,
                    "SELECT id FROM reaper.tasks WHERE worker = $1 AND state = 'pending'"
                    " ORDER BY created_at, id",
                    worker,
                )
            result.status.orphans = orphans
            return result

    async def _mark(self, conn: asyncpg.Connection, store: MarkStore, inp: ReconcileInput,
                    result: ReconcileResult) -> list[str]:
        """Mark the absent rows, unless the report drops suspiciously many (issue 3, rule 6).

        The check marks under a savepoint and rolls the marks back when too many, so the
        report is diffed once, not counted first and diffed again.
        """
        kind, markable = inp.kind, MARKABLE[inp.kind]
        held = None
        if not inp.confirmed:
            held = await conn.fetchval(store.held[kind], inp.worker, markable)
            if held < inp.suspect_min_handles:
                held = None
        try:
            async with conn.transaction():  # a savepoint
                marked = await _column(conn, store.mark[kind], inp.worker, inp.taken_at,
                                       markable)
                if held is not None and len(marked) > inp.max_drop_fraction * held:
                    raise _TooMany(len(marked), held)
        except _TooMany as too:
            result.suspect = f"drops {too.args[0]} of {too.args[1]} {kind} at once"
            return []
        result.marked = len(marked)
        return marked

    async def _collect_stuck_creating(self, conn: asyncpg.Connection, inp: ReconcileInput) -> None:
        fleet = await conn.fetchval("SELECT state FROM reaper.fleet WHERE id = 1")
        if fleet == "full":
            return
        cutoff = inp.taken_at - timedelta(seconds=inp.creating_timeout)
        sql = (_WOULD_STUCK_CREATING if inp.dry_run else _STUCK_CREATING)[inp.kind]
        stuck = await _column(conn, sql, inp.worker, cutoff)
        await write_events(
            conn, inp.worker, EVENT_KIND[inp.kind], "destroyed", stuck, "creating-timeout",
            dry_run=inp.dry_run,
            dedupe=[f"stuck:{inp.worker}:{inp.kind}:{h}" for h in stuck] if inp.dry_run else None,
        )

    @activity.defn(name="destroy_missing")
    async def destroy_missing(self, inp: DestroyInput) -> DestroyResult:
        """Destroy the worker's rows of ``kind`` missing since ``cutoff`` or earlier.

        Containers and volumes: row deleted. Tasks: ``stopped`` with ``stop_reason``
        ``missing`` and the service backfilled. One ``events`` row per destroy, in the same
        transaction. Refused (nothing changes) unless the worker is ``running`` and the fleet
        is not in full disruption (rules 4 and 6). The caller passes a ``cutoff`` of
        ``taken_at - MISSING_TTL`` of a report it has just reconciled, so every complete
        report since ``missing_since``, including the latest, lacked the handle (rule 4).
        """
        kind = inp.kind
        async with self.pool.acquire() as conn, conn.transaction():
            state = await conn.fetchval(
                "SELECT state FROM reaper.workers WHERE name = $1 FOR SHARE", inp.worker
            )
            if state != "running":
                return DestroyResult(refused=f"worker is {state or 'unknown'}")
            fleet = await conn.fetchval("SELECT state FROM reaper.fleet WHERE id = 1")
            if fleet == "full":
                return DestroyResult(refused="fleet in full disruption")
            sql = (_WOULD_DESTROY if inp.dry_run else _DESTROY)[kind]
            rows = await conn.fetch(sql, inp.worker, inp.cutoff, MARKABLE[kind])
            destroyed = [r["handle"] for r in rows]
            action = "stopped" if kind == "tasks" else "destroyed"
            await write_events(
                conn, inp.worker, EVENT_KIND[kind], action, destroyed, "missing",
                dry_run=inp.dry_run,
                dedupe=[f"{action}:{inp.worker}:{kind}:{r['handle']}:{r['missing_since']}"
                        for r in rows] if inp.dry_run else None,
            )
            result = DestroyResult(destroyed=destroyed)
            if kind == "tasks" and rows:
                services = [r["service"] for r in rows]
                result.replacements, _ = await backfill(
                    conn, services, "missing", dry_run=inp.dry_run,
                    assume_inactive=services if inp.dry_run else (),
                )
            store = DRY if inp.dry_run else ROWS
            result.status = await _status(conn, store, inp.worker, kind, inp.missing_ttl)
            return result


def _count(command_tag: str) -> int:
    """Rows affected, from an asyncpg command tag such as ``UPDATE 3``."""
    return int(command_tag.rsplit(" ", 1)[-1])


async def _column(conn: asyncpg.Connection, sql: str, *args: object) -> list[str]:
    return [r[0] for r in await conn.fetch(sql, *args)]


async def _status(
    conn: asyncpg.Connection, store: MarkStore, worker: str, kind: str, ttl: float
) -> KindStatus:
    row = await conn.fetchrow(store.status[kind], worker)
    oldest: datetime | None = row["oldest"]
    return KindStatus(
        missing=row["n"],
        next_due=oldest + timedelta(seconds=ttl) if oldest is not None else None,
    )
