"""The destroy of handles missing for ``MISSING_TTL`` (CONTRACT.md rule 4).

The collector calls it after it has reconciled a fresh complete report
(:mod:`activities.collection`); the rule is ``reaper.core.policy.collection``'s
(``destroy_cutoff``, ``destroy_refused``) and the statement ``collection_sql.REMOVE_MISSING``,
guarded by the marks it expects, so a retry destroys nothing twice.
"""

from __future__ import annotations

import logging

from temporalio import activity

from activities import collection_sql as sql
from activities import metrics
from activities.base import EVENT_KIND, ActivityBase, write_events
from activities.collection import kind_status, seal_refusal
from activities.tasks import backfill
from activities.types import DestroyInput, DestroyResult
from reaper.core import kinds, states
from reaper.core.policy import collection as policy

log = logging.getLogger("reaper.collection")


class DestroyActivities(ActivityBase):
    """The destroy step of ``HandleCollector`` (one collector per worker, ``gc-{worker}``)."""

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
        r = inp.report
        unsealed = seal_refusal(inp.worker, kind, r, None, r.taken_at if r else None)
        if unsealed is None and r is not None:
            if inp.missing_ttl < self.settings.missing_ttl:
                unsealed = f"MISSING_TTL {inp.missing_ttl:g}s is below the controller's"
            elif inp.cutoff > policy.destroy_cutoff(kind, r.taken_at, inp.missing_ttl):
                unsealed = "cutoff later than the report's taken_at - MISSING_TTL"
        if unsealed is not None:
            log.warning("destroy for %s %s refused: %s", inp.worker, kind, unsealed)
            return DestroyResult(refused=unsealed)
        async with self.gc_pool.acquire() as conn, conn.transaction():
            await conn.execute(sql.COLLECTING)
            row = await conn.fetchrow(sql.WORKER_FOR_SHARE, inp.worker)
            fleet = await conn.fetchval(sql.FLEET_STATE)
            refused = policy.destroy_refused(row["state"] if row else None, fleet == "full")
            if refused is not None:
                return DestroyResult(refused=refused)
            statement = (sql.WOULD_REMOVE_MISSING if inp.dry_run else sql.REMOVE_MISSING)[kind]
            of = kinds.kind(kind)
            args = (states.DESTROYED.value,) if of.task and not inp.dry_run else ()
            rows = await conn.fetch(statement, inp.worker, inp.cutoff, sql.MARKABLE[kind], *args)
            destroyed = [r["handle"] for r in rows]
            action = of.destroyed
            await write_events(
                conn,
                inp.worker,
                EVENT_KIND[kind],
                action,
                destroyed,
                "missing",
                dry_run=inp.dry_run,
                dedupe=[
                    f"{action}:{inp.worker}:{kind}:{r['handle']}:{r['missing_since']}" for r in rows
                ]
                if inp.dry_run
                else None,
            )
            result = DestroyResult(destroyed=destroyed)
            if of.task and rows:
                services = [r["service"] for r in rows]
                result.replacements, _ = await backfill(
                    conn,
                    services,
                    "missing",
                    dry_run=inp.dry_run,
                    assume_inactive=services if inp.dry_run else (),
                )
            store = sql.DRY if inp.dry_run else sql.ROWS
            result.status = await kind_status(conn, store, inp.worker, kind, inp.missing_ttl)
        if not inp.dry_run:
            metrics.count_destroyed(kind, len(destroyed))
        return result
