"""Report garbage collection: mark and clear missing handles (CONTRACT.md rules 1-3); the
destroy (rule 4) is :mod:`activities.destroy`'s.

The decisions are ``reaper.core.policy.collection``'s; the statements (``collection_sql``)
apply them set-wise, each guarded by the state it expects. In a dry run the same verbs keep
their marks in ``reaper.dry_marks`` and write ``would-`` events, leaving the user's rows
untouched.
"""

from __future__ import annotations

import logging
from datetime import datetime

import asyncpg
from temporalio import activity

from activities import collection_sql as sql
from activities import metrics, migration, sealing
from activities.base import EVENT_KIND, ActivityBase, column, command_count, write_events
from activities.changes import wake_upkeep
from activities.creating import fail_stuck_creating
from activities.types import (
    ReconcileInput,
    ReconcileResult,
    SealedReport,
)
from reaper.core import kinds, states
from reaper.core.models import KindStatus
from reaper.core.policy import collection as policy

log = logging.getLogger("reaper.collection")


class _TooMany(Exception):
    """A report would mark more than the mass-drop rule allows (rolls its marks back)."""


async def _load_report(conn: asyncpg.Connection, inp: ReconcileInput) -> bool:
    """Put the report's handles in ``REPORT`` and its diff against the worker's rows
    in ``DIFF`` (inside the caller's transaction).

    A staged report is copied within Postgres from ``reaper.report_chunks``; an inline one
    is sent once by COPY. Returns False if a staged report is gone.
    """
    await conn.execute(sql.CREATE_REPORT)
    if inp.staged_id is not None:
        found = await conn.fetchval(sql.LOAD_STAGED, inp.worker, inp.kind, inp.staged_id)
        if not found:
            return False
    else:
        await conn.copy_records_to_table(
            sql.REPORT.split(".")[1],
            schema_name="pg_temp",
            columns=["h"],
            records=[(h,) for h in inp.handles],  # repeats and all, as a staged report
        )
    await conn.execute(sql.PREPARE_DIFF)
    await conn.execute(sql.DIFF_REPORT[inp.kind], inp.worker)
    return True


def seal_refusal(
    worker: str,
    kind: str,
    r: SealedReport | None,
    handles: list[str] | None,
    taken_at: datetime | None,
) -> str | None:
    """Why a report may not be acted on (not sealed by this worker's liveness), or ``None``.

    Args:
        worker, kind: whose report, of which kind (``containers``, ``volumes``, ``tasks``).
        r: the report as forwarded (with its seal), if any.
        handles: its handles when inline (``None``: the seal covers the digest only).
        taken_at: when the report was taken (UTC), as the caller acts on it.
    """
    if r is None or taken_at != r.taken_at:
        return "unsealed report: not forwarded by the worker's liveness"
    if not sealing.is_sealed(r.seal, worker, kind, r, handles):
        return "bad seal: not forwarded by the worker's liveness"
    return None


def beyond_seal(
    r: SealedReport | None, staged_id: str | None, restart_all: bool, also_seen: list[str]
) -> str | None:
    """Why a reconcile's inputs do more than the sealed report ``r`` allows, or ``None``.

    They must diff the report sealed (``staged_id``) and restart at least the clocks it
    restarts; they may restart more (``restart_all`` set, or more handles in ``also_seen``):
    the collector adds what older reports it superseded in its queue saw
    (``reaper.core.models.supersede_queued``), and a restarted clock only delays a destroy
    (rule 4). Checked after :func:`seal_refusal`, which vouches for ``r``.
    """
    if r is None or (
        r.staged_id == staged_id
        and (restart_all or not r.restart_all)
        and set(r.also_seen) <= set(also_seen)
    ):
        return None
    return "bad seal: the report differs from the one sealed"


class CollectionActivities(ActivityBase):
    """Activities called by ``HandleCollector`` (one collector per worker, ``gc-{worker}``)."""

    @activity.defn(name="reconcile_report")
    @metrics.timed_reconcile
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
        unsealed = seal_refusal(
            inp.worker, inp.kind, inp.report, inp.handles, inp.taken_at
        ) or beyond_seal(inp.report, inp.staged_id, inp.restart_all, inp.also_seen)
        if unsealed is not None:
            log.warning("report for %s %s refused: %s", inp.worker, inp.kind, unsealed)
            return ReconcileResult(skipped=unsealed)
        kind, worker, dry = inp.kind, inp.worker, inp.dry_run
        task = kinds.kind(kind).task
        store = sql.DRY if dry else sql.ROWS
        async with self.gc_pool.acquire() as conn, conn.transaction():
            await conn.execute(sql.COLLECTING)
            row = await conn.fetchrow(sql.WORKER_FOR_SHARE, worker)
            skipped = policy.report_decides(
                row["state"] if row else None, row["state_since"] if row else None, inp.taken_at
            )
            if skipped is not None:
                return ReconcileResult(skipped=skipped)
            if not await _load_report(conn, inp):
                return ReconcileResult(skipped=f"staged report {inp.staged_id} is gone")
            result = ReconcileResult()
            wake = False
            if task and not dry:
                result.started = await column(
                    conn,
                    sql.START_REPORTED_TASKS,
                    worker,
                    states.STARTED.value,
                    states.STARTING_TASKS,
                )
                wake = await migration.next_step_due(conn, result.started)
            # The report's table has no statistics, which the planner guesses small: left to
            # itself it would clear against a 100,000-handle report by nested loop,
            # O(marked rows x handles). Hash joins while marked rows are looked up in the
            # report; index probes (nested loops) again for the few rows in ``DIFF``.
            await conn.execute("SET LOCAL enable_nestloop = off")
            result.cleared = command_count(await conn.execute(store.clear[kind], worker))
            await conn.execute("SET LOCAL enable_nestloop = on")
            if inp.also_seen:
                await conn.execute(store.restart[kind], worker, inp.also_seen, inp.taken_at)
            if inp.restart_all:
                await conn.execute(store.restart_all[kind], worker, inp.taken_at)
            marked = await self._mark(conn, store, inp, result)
            if dry:
                await write_events(
                    conn,
                    worker,
                    EVENT_KIND[kind],
                    "mark",
                    marked,
                    "missing from report",
                    dry_run=True,
                    dedupe=[f"mark:{worker}:{kind}:{h}:{inp.taken_at.isoformat()}" for h in marked],
                )
            stuck: list[str] = []
            creating_due = None
            if not task:
                stuck, creating_due = await fail_stuck_creating(
                    conn, inp, self.settings.stall_after
                )
                if stuck and not dry:  # rows gone: their reported handles are unknown now
                    await conn.execute(sql.UNKNOWN_AFTER_DELETE, stuck)
            cutoff = policy.orphan_cutoff(inp.taken_at, inp.missing_ttl)
            result.status = await kind_status(conn, store, worker, kind, inp.missing_ttl)
            unknown = await conn.fetch(sql.UNKNOWN[kind], worker, kind, inp.taken_at, cutoff)
            await _record_orphans(
                conn,
                worker,
                kind,
                [
                    (r["handle"], f"orphan:{worker}:{kind}:{r['handle']}:{r['first_seen']}")
                    for r in unknown
                ],
                f"reported but unknown for {inp.missing_ttl:g}s (MISSING_TTL)",
            )
            orphans = [r["handle"] for r in unknown]
            pending = await conn.fetchval(sql.NEXT_ORPHAN, worker, kind, cutoff)
            orphan_due = policy.orphan_due(pending, inp.missing_ttl)
            result.status.recheck_due = policy.recheck_at(orphan_due, creating_due)
            if task:
                reaped = await column(conn, sql.ORPHANED_TASKS, worker, states.ENDED_TASKS)
                await _record_orphans(
                    conn,
                    worker,
                    kind,
                    [(t, f"orphan:{worker}:tasks:{t}") for t in reaped],
                    "reported but reaped (rule 7)",
                )
                orphans = sorted({*orphans, *reaped})
                result.assignments = await column(
                    conn, sql.ASSIGNMENTS, worker, states.STARTING_TASKS
                )
                result.drained = bool(row["drained"])
            result.status.orphans = orphans
        if not dry:
            metrics.count_destroyed(kind, len(stuck))
        if wake:
            await wake_upkeep(self.settings.peer_version)
        return result

    async def _mark(
        self,
        conn: asyncpg.Connection,
        store: sql.MarkStore,
        inp: ReconcileInput,
        result: ReconcileResult,
    ) -> list[str]:
        """Mark the absent rows, unless the report drops suspiciously many
        (``policy.mass_drop_held``).

        The check marks under a savepoint and rolls the marks back when too many, so the
        report is diffed once, not counted first and diffed again.
        """
        kind, markable = inp.kind, sql.MARKABLE[inp.kind]
        held = 0
        if not inp.confirmed:
            held = await conn.fetchval(store.held[kind], inp.worker, markable)
        try:
            async with conn.transaction():  # a savepoint
                marked = await column(conn, store.mark[kind], inp.worker, inp.taken_at, markable)
                if policy.mass_drop_held(
                    len(marked), held, inp.max_drop_fraction, inp.suspect_min_handles, inp.confirmed
                ):
                    raise _TooMany(len(marked), held)
        except _TooMany as too:
            result.suspect = f"drops {too.args[0]} of {too.args[1]} {kind} at once"
            return []
        result.marked = len(marked)
        return marked


async def _record_orphans(
    conn: asyncpg.Connection,
    worker: str,
    kind: str,
    keyed: list[tuple[str, str]],
    reason: str,
) -> None:
    """One ``orphan`` events row (and log line) per handle that has just become an orphan.

    ``keyed`` pairs each orphan with its dedupe key, which names the orphan once: an unknown
    handle by when it was first reported (if it goes and comes back it is a new orphan), a
    reaped task by its id. Every later reconcile that lists the same orphan, a retry or a
    rerun, finds the key taken and writes nothing. Written in dry runs too: the orphans list
    reaches the agent either way.
    """
    if keyed:
        await write_events(
            conn,
            worker,
            EVENT_KIND[kind],
            "orphan",
            [h for h, _ in keyed],
            reason,
            dedupe=[key for _, key in keyed],
        )


async def kind_status(
    conn: asyncpg.Connection, store: sql.MarkStore, worker: str, kind: str, ttl: float
) -> KindStatus:
    """How many of ``worker``'s rows of ``kind`` are marked in ``store`` (the user's rows, or
    a dry run's marks), and when the oldest mark falls due after ``ttl`` seconds."""
    row = await conn.fetchrow(store.status[kind], worker)
    oldest: datetime | None = row["oldest"]
    return KindStatus(missing=row["n"], next_due=policy.next_due(kind, oldest, ttl))
