"""Retiring a worker: it leaves the fleet for good (CONTRACT.md §5.1)."""

from __future__ import annotations

from temporalio import activity

from activities import metrics
from activities.base import ActivityBase, per_kind, write_events
from activities.fleet import refresh_fleet
from activities.tasks import replace_tasks
from activities.types import RetireRequest
from reaper.core import kinds
from reaper.core.contract import WorkerState
from reaper.core.models import ReapResult
from reaper.core.policy.fleet import may_retire

_DELETE_ROWS = per_kind(
    "DELETE FROM {table} WHERE worker = $1 RETURNING {key} AS handle", kinds.HANDLE_ROWS
)
"""A retired worker's container and volume rows, deleted (§5.1)."""
_WOULD_DELETE_ROWS = per_kind(
    "SELECT {key} AS handle FROM {table} WHERE worker = $1 ORDER BY {key}", kinds.HANDLE_ROWS
)
"""What :data:`_DELETE_ROWS` would delete (a dry run)."""
_HOUSEKEEPING = (
    "DELETE FROM reaper.unknown_handles WHERE worker = $1",
    "DELETE FROM reaper.dry_marks WHERE worker = $1",
    "DELETE FROM reaper.report_chunks WHERE worker = $1",
    "DELETE FROM reaper.agent_keys WHERE worker = $1",  # a pin ends with the worker (§5.2)
)
"""What reaper itself keeps of a worker, dropped with it."""


class RetireActivities(ActivityBase):
    """Activities called by ``WorkerLiveness`` when its worker is retired."""

    @activity.defn(name="retire_worker")
    async def retire_worker(self, req: RetireRequest) -> ReapResult:
        """Retire ``req.worker`` in one transaction, if ``policy.fleet.may_retire`` allows.

        Its ``running`` and ``pending`` tasks become ``lost`` (``stop_reason``
        ``worker-retired``) and their services are backfilled (rule 5); its ``containers``
        and ``volumes`` rows are deleted, one ``destroyed`` event each naming the
        retirement; ``workers.state`` becomes ``retired`` (an ``events`` row ``state``,
        ``... -> retired: reason``); the fleet's disruption state is recomputed without it.
        In a dry run only ``would-`` events are written. Idempotent: a retry finds the
        worker retired and changes nothing (``refused`` says so).
        """
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT state, state_since, reaped_at FROM reaper.workers WHERE name = $1"
                " FOR UPDATE",
                req.worker,
            )
            fleet = await conn.fetchval("SELECT state FROM reaper.fleet WHERE id = 1")
            state = row["state"] if row else None
            reap_done = bool(row and row["reaped_at"] and row["reaped_at"] >= row["state_since"])
            verdict = may_retire(
                req.automatic,
                state,
                reap_done,
                row["state_since"] if row else None,
                fleet,
                req.at,
                req.retire_after,
            )
            if not verdict.allowed:
                return ReapResult(refused=verdict.refused, retry_at=verdict.retry_at)
            why = f"retired: {req.reason}" if req.reason else "retired"
            lost, placed, owed = await replace_tasks(
                conn,
                req.worker,
                "worker-retired",
                why,
                req.actor,
                f"retirement of {req.worker}",
                dry_run=req.dry_run,
            )
            destroyed: dict[str, int] = {}
            for kind in kinds.HANDLE_ROWS:
                statement = (_WOULD_DELETE_ROWS if req.dry_run else _DELETE_ROWS)[kind.report]
                gone = [r["handle"] for r in await conn.fetch(statement, req.worker)]
                destroyed[kind.word] = len(gone)
                await write_events(
                    conn,
                    req.worker,
                    kind.word,
                    kind.destroyed,
                    sorted(gone),
                    why,
                    req.actor,
                    dry_run=req.dry_run,
                )
            await write_events(
                conn,
                req.worker,
                "worker",
                "state",
                [req.worker],
                f"{state} -> retired: {req.reason}",
                req.actor,
                dry_run=req.dry_run,
            )
            if not req.dry_run:
                for statement in _HOUSEKEEPING:
                    await conn.execute(statement, req.worker)
                await conn.execute(
                    "UPDATE reaper.workers SET state = $3, state_since = $2, draining = false,"
                    " drained_at = NULL, migrate_since = NULL, migrate_until = NULL"
                    " WHERE name = $1",
                    req.worker,
                    req.at,
                    WorkerState.retired.value,
                )
                await refresh_fleet(conn, self.settings.disruption_threshold, req.at)
        if not req.dry_run:
            metrics.count_reaped(len(lost))
            for word, n in destroyed.items():
                metrics.count_destroyed(word, n)
        return ReapResult(lost_tasks=lost, replacements=placed, owed=owed)
