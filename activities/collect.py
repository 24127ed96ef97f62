"""Report garbage collection: mark, clear and destroy missing handles (CONTRACT.md rules 1-4).

The verbs follow Concourse's ``atc/db`` (``UpdateContainersMissingSince``,
``RemoveMissingContainers``): each statement is guarded by the state it expects, so a race
or a retry turns into "0 rows", never into harm, and only rows whose ``missing_since``
actually changes are written.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import asyncpg
from temporalio import activity

from activities.base import EVENT_KIND, ActivityBase, per_kind, unique, write_events
from activities.placement import backfill
from activities.types import DestroyInput, DestroyResult, ReconcileInput, ReconcileResult
from reaper.models import KindStatus

MARKABLE = {
    "containers": ["created", "destroying"],
    "volumes": ["created", "destroying"],
    "tasks": ["running"],
}
"""States whose rows may be marked missing (rule 2: never ``creating``, never ``pending``)."""

# Rows of the worker that reappear in the report: clear their mark (rule 3).
_CLEAR = per_kind(
    "UPDATE {table} SET missing_since = NULL"
    " WHERE worker = $1 AND missing_since IS NOT NULL AND {key} = ANY($2::text[])"
)
# Rows of the worker absent from the report: mark them, unless still creating or changed
# state after the report was taken (rule 2). Unchanged rows are not written (rule 3).
_MARK = per_kind(
    "UPDATE {table} t SET missing_since = $3"
    " WHERE t.worker = $1 AND t.missing_since IS NULL AND t.state = ANY($4::text[])"
    "  AND t.state_changed_at <= $3"
    "  AND NOT EXISTS (SELECT 1 FROM unnest($2::text[]) AS r(h) WHERE r.h = t.{key})"
)
# Marked rows that a superseded report still held: seen after their mark, so their clock
# restarts at this report (rule 4: every report since missing_since must lack the handle).
_RESTART = per_kind(
    "UPDATE {table} SET missing_since = $3"
    " WHERE worker = $1 AND missing_since IS NOT NULL AND missing_since < $3"
    " AND {key} = ANY($2::text[])"
)
_MISSING = per_kind(
    "SELECT count(*) AS n, min(missing_since) AS oldest FROM {table}"
    " WHERE worker = $1 AND missing_since IS NOT NULL"
)
# Reported handles the database does not hold for this worker: remember when first seen,
# forget those no longer reported; the ones older than MISSING_TTL are orphans.
_UNKNOWN = per_kind(
    "WITH u AS (SELECT DISTINCT r.h FROM unnest($3::text[]) AS r(h)"
    "  WHERE NOT EXISTS (SELECT 1 FROM {table} t WHERE t.{key} = r.h AND t.worker = $1)),"
    " ins AS (INSERT INTO reaper.unknown_handles (worker, kind, handle, first_seen)"
    "  SELECT $1, $2, h, $4 FROM u ON CONFLICT DO NOTHING),"
    " del AS (DELETE FROM reaper.unknown_handles x WHERE x.worker = $1 AND x.kind = $2"
    "  AND NOT EXISTS (SELECT 1 FROM u WHERE u.h = x.handle))"
    " SELECT x.handle FROM reaper.unknown_handles x JOIN u ON u.h = x.handle"
    " WHERE x.worker = $1 AND x.kind = $2 AND x.first_seen <= $5 ORDER BY x.handle"
)
_DESTROY = {
    kind: (
        f"DELETE FROM {table} WHERE worker = $1 AND missing_since IS NOT NULL"
        " AND missing_since <= $2 AND state = ANY($3::text[]) RETURNING handle, NULL AS service"
    )
    for kind, table in (("containers", "reaper.containers"), ("volumes", "reaper.volumes"))
}
_DESTROY["tasks"] = (
    "UPDATE reaper.tasks SET state = 'stopped', stop_reason = 'missing', missing_since = NULL"
    " WHERE worker = $1 AND missing_since IS NOT NULL AND missing_since <= $2"
    " AND state = ANY($3::text[]) RETURNING id AS handle, service"
)
_WOULD_DESTROY = per_kind(
    "SELECT handle, NULL::text AS service FROM {table} WHERE worker = $1"
    " AND missing_since IS NOT NULL AND missing_since <= $2 AND state = ANY($3::text[])"
)
_WOULD_DESTROY["tasks"] = (
    "SELECT id AS handle, service FROM reaper.tasks WHERE worker = $1"
    " AND missing_since IS NOT NULL AND missing_since <= $2 AND state = ANY($3::text[])"
)


class CollectActivities(ActivityBase):
    """Activities called by ``HandleCollector`` (one collector per worker, ``gc-{worker}``)."""

    @activity.defn(name="reconcile_report")
    async def reconcile_report(self, inp: ReconcileInput) -> ReconcileResult:
        """Diff a complete report against the worker's rows: mark newly missing, clear returned.

        Only a ``running`` worker's report marks or clears (rule 1); ``creating`` rows and rows
        that changed state after ``taken_at`` are never marked (rule 2); rows whose
        ``missing_since`` would not change are not written (rule 3). For tasks, a ``pending``
        task placed on the worker that it reports becomes ``running`` (rule 5), and reported
        tasks that were reaped are orphans (rule 7). Idempotent: a rerun of the same report
        finds nothing left to change.

        Args:
            inp: ``handles`` is the complete list; ``taken_at`` the controller's UTC receive
                time, which becomes ``missing_since`` of rows newly marked.
        """
        handles = unique(inp.handles)
        kind = inp.kind
        async with self.pool.acquire() as conn, conn.transaction():
            state = await conn.fetchval(
                "SELECT state FROM reaper.workers WHERE name = $1 FOR SHARE", inp.worker
            )
            if state != "running":
                return ReconcileResult(skipped=f"worker is {state or 'unknown'}")
            result = ReconcileResult()
            if kind == "tasks":
                result.started = [
                    r["id"]
                    for r in await conn.fetch(
                        "UPDATE reaper.tasks SET state = 'running'"
                        " WHERE worker = $1 AND state = 'pending' AND id = ANY($2::text[])"
                        " RETURNING id",
                        inp.worker,
                        handles,
                    )
                ]
            result.cleared = _count(
                await conn.execute(_CLEAR[kind], inp.worker, handles)
            )
            if inp.also_seen:
                await conn.execute(_RESTART[kind], inp.worker, inp.also_seen, inp.taken_at)
            result.marked = _count(
                await conn.execute(
                    _MARK[kind],
                    inp.worker, handles, inp.taken_at, MARKABLE[kind],
                )
            )
            cutoff = inp.taken_at - timedelta(seconds=inp.missing_ttl)
            result.status = await _status(conn, inp.worker, kind, inp.missing_ttl)
            orphans = [
                r["handle"]
                for r in await conn.fetch(
                    _UNKNOWN[kind],
                    inp.worker, kind, handles, inp.taken_at, cutoff,
                )
            ]
            if kind == "tasks":
                reaped = await conn.fetch(
                    "SELECT id FROM reaper.tasks WHERE worker = $1"
                    " AND state IN ('lost', 'stopped') AND id = ANY($2::text[]) ORDER BY id",
                    inp.worker,
                    handles,
                )
                orphans = sorted({*orphans, *(r["id"] for r in reaped)})
                result.assignments = [
                    r["id"]
                    for r in await conn.fetch(
                        "SELECT id FROM reaper.tasks WHERE worker = $1 AND state = 'pending'"
                        " ORDER BY created_at, id",
                        inp.worker,
                    )
                ]
            result.status.orphans = orphans
            return result

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
            )
            result = DestroyResult(destroyed=destroyed)
            if kind == "tasks" and rows:
                result.replacements, _ = await backfill(
                    conn, [r["service"] for r in rows], "missing", dry_run=inp.dry_run
                )
            result.status = await _status(conn, inp.worker, kind, inp.missing_ttl)
            return result


def _count(command_tag: str) -> int:
    """Rows affected, from an asyncpg command tag such as ``UPDATE 3``."""
    return int(command_tag.rsplit(" ", 1)[-1])


async def _status(conn: asyncpg.Connection, worker: str, kind: str, ttl: float) -> KindStatus:
    row = await conn.fetchrow(_MISSING[kind], worker)
    oldest: datetime | None = row["oldest"]
    return KindStatus(
        missing=row["n"],
        next_due=oldest + timedelta(seconds=ttl) if oldest is not None else None,
    )
