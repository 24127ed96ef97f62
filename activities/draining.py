"""The drain activities (CONTRACT.md §5.1, §6.1): a worker's ``draining``, the migration a
drain starts or an undrain ends, one transaction per batch of requests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
from temporalio import activity

from activities import metrics, migration
from activities.base import ActivityBase, write_events
from activities.types import DrainChange, DrainOutcome
from reaper.core.liveness_state import DrainRequest
from reaper.core.policy.drain import drain_changes, drain_effects

_DRAIN_ROW = (
    "SELECT draining, migrate_until, drained_at FROM reaper.workers WHERE name = $1 FOR UPDATE"
)


class DrainActivities(ActivityBase):
    """Apply drain and undrain requests to ``reaper.workers``."""

    @activity.defn(name="drain_worker")
    async def drain_worker(self, change: DrainChange) -> DrainOutcome:
        """Apply ``change``'s drain and undrain requests in order, in one transaction, as
        ``policy.drain.drain_effects`` says (CONTRACT.md §5.1, §6.1): ``workers.draining``
        with an ``events`` row (``drain``, ``undrain``) for each that changes it, keyed by
        the request's ``key``; a migrating drain starts its migration (``migrate_since``,
        ``migrate_until`` = ``change.at`` + its deadline); an undrain ends one
        (``activities.migration.cancel``) and clears ``drained_at``. What the fleet monitor
        then does with a migration is ``activities.migration``'s. The liveness of a
        ``rotating-hosts`` run calls this where 1.1's called ``set_draining``.

        Idempotent: a retry whose batch wrote an event finds its key and returns the row as
        it is. Returns the keys of the requests that changed the worker and the row after.
        """
        requests = change.requests()
        keys = [r.key for r in requests if r.key]
        at = change.at or datetime.now(UTC)
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO reaper.workers (name, state_since) VALUES ($1, now())"
                " ON CONFLICT (name) DO NOTHING",
                change.worker,
            )
            row = await conn.fetchrow(_DRAIN_ROW, change.worker)
            if keys and await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM reaper.events WHERE dedupe = ANY($1::text[]))",
                keys,
            ):
                return DrainOutcome(
                    draining=row["draining"],
                    migrate_until=row["migrate_until"],
                    drained_at=row["drained_at"],
                )
            effects = drain_effects(row["draining"], row["migrate_until"], requests, at)
            outcome, replaced = DrainOutcome(), 0
            for e in effects:
                req = e.request
                if e.cancels:
                    stopped, moved = await migration.cancel(conn, change.worker)
                    outcome.cancelled += stopped
                    replaced += len(moved)
                if e.migrates:
                    deadline = req.deadline if req.deadline is not None else change.default_deadline
                    await conn.execute(
                        "UPDATE reaper.workers SET migrate_since = $2, migrate_until = $3"
                        " WHERE name = $1",
                        change.worker,
                        at,
                        at + timedelta(seconds=deadline),
                    )
                if not e.changes:
                    continue
                why = req.reason
                if e.migrates:
                    how = f"migrate, deadline {req.deadline or change.default_deadline:g}s"
                    why = f"{why} ({how})" if why else how
                await _drain_event(conn, change.worker, req, why)
                outcome.changed.append(req.key)
            last = next((e.request for e in reversed(effects) if e.draining), None)
            if last is not None:
                await conn.execute(
                    "UPDATE reaper.workers SET draining = $2, drain_reason = $3,"
                    " drained_at = CASE WHEN $2 THEN drained_at END WHERE name = $1",
                    change.worker,
                    last.draining,
                    last.reason or None,
                )
            after = await conn.fetchrow(_DRAIN_ROW, change.worker)
            outcome.draining = after["draining"]
            outcome.migrate_until = after["migrate_until"]
            outcome.drained_at = after["drained_at"]
        metrics.count_migrations("cancelled", len(outcome.cancelled))
        metrics.count_migrations("replaced", replaced)
        return outcome

    @activity.defn(name="set_draining")
    async def set_draining(self, change: DrainChange) -> bool:
        """Apply ``change``'s requests to ``workers.draining`` in order, in one transaction:
        an ``events`` row (``drain``, ``undrain``) for each that changes it
        (``policy.drain.drain_changes``), keyed by the request's ``key``; the row ends at the
        newest request's value and ``drain_reason`` at the last change's reason. A worker
        without a row gets one. Returns True if any request changed it.

        A draining worker gets no new placements (Nomad's drain, Kubernetes' cordon).
        Idempotent: a retry whose batch wrote an event finds its key and changes nothing;
        one whose batch changed nothing finds the row as it was and changes nothing again.
        Keys name the run (``DrainRequest.key``): a batch that a run reset by the repair
        (``activities/repair.py``) sends again under its new run id, having committed before
        the reset point's history recorded it, writes its rows a second time.
        """
        requests = change.requests()
        keys = [r.key for r in requests if r.key]
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO reaper.workers (name, state_since) VALUES ($1, now())"
                " ON CONFLICT (name) DO NOTHING",
                change.worker,
            )
            draining = await conn.fetchval(
                "SELECT draining FROM reaper.workers WHERE name = $1 FOR UPDATE", change.worker
            )
            if keys and await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM reaper.events WHERE dedupe = ANY($1::text[]))",
                keys,
            ):
                return False
            changes = drain_changes(draining, requests)
            for req in changes:
                await _drain_event(conn, change.worker, req, req.reason)
            if changes:  # the row's value, and the reason of the last change
                await conn.execute(
                    "UPDATE reaper.workers SET draining = $2, drain_reason = $3 WHERE name = $1",
                    change.worker,
                    changes[-1].draining,
                    changes[-1].reason or None,
                )
            return bool(changes)


async def _drain_event(conn: asyncpg.Connection, worker: str, req: DrainRequest, why: str) -> None:
    """The ``events`` row of one drain request that changed ``worker`` (``drain`` or
    ``undrain``, by ``req.actor``, because ``why``), keyed by the request's ``key`` so that a
    retry of the batch finds it."""
    await write_events(
        conn,
        worker,
        "worker",
        "drain" if req.draining else "undrain",
        [worker],
        why,
        req.actor,
        dedupe=[req.key] if req.key else None,
    )
