"""Reaping a lost (or force-reaped) worker: its tasks ``lost``, its services backfilled."""

from __future__ import annotations

from datetime import datetime

import asyncpg
from temporalio import activity

from activities import metrics
from activities.base import ActivityBase
from activities.tasks import replace_tasks
from activities.types import ReapRequest
from reaper.core.models import ReapResult
from reaper.core.policy import fleet as fleet_policy
from reaper.core.policy.fleet import Bucket


async def take_reap_token(
    conn: asyncpg.Connection, at: datetime, rate: float, burst: int
) -> datetime | None:
    """Take one token from the fleet-wide reap bucket (``policy.fleet.take_reap_token``).

    Runs in the caller's transaction with the bucket row locked. ``at`` is the controller's
    time, UTC. Returns ``None`` if a token was taken, else when to retry.
    """
    row = await conn.fetchrow(
        "SELECT tokens, updated_at FROM reaper.reap_tokens WHERE id = 1 FOR UPDATE"
    )
    bucket = None if row["tokens"] is None else Bucket(row["tokens"], row["updated_at"])
    taken, retry_at = fleet_policy.take_reap_token(bucket, at, rate, burst)
    if taken is not None:
        await conn.execute(
            "UPDATE reaper.reap_tokens SET tokens = $1, updated_at = $2 WHERE id = 1",
            taken.tokens,
            taken.updated_at,
        )
    return retry_at


class ReapActivities(ActivityBase):
    """Activities called by ``WorkerReap`` (``reap-{worker}-{n}``)."""

    @activity.defn(name="reap_worker")
    async def reap_worker(self, req: ReapRequest) -> ReapResult:
        """Reap ``req.worker`` in one transaction (CONTRACT.md rules 5 and 6).

        Its ``running`` and ``pending`` tasks become ``lost`` (``stop_reason`` ``worker-lost``,
        an ``events`` row each carrying ``req.reason``), and each affected service is backfilled
        with replacement ``pending`` tasks on healthy, non-draining workers.

        Whether it may run is ``reaper.core.policy.fleet.may_reap`` (disruption, fresh
        ``LOST_AFTER`` after a recovery), then the rate limit for automatic reaps;
        ``refused`` says why not and ``retry_at`` when to try again. A forced reap
        (operator) is refused only for an unknown worker.

        Idempotent: a retry finds no running task left and each service already at its count.
        """
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT state, force_reap_at FROM reaper.workers WHERE name = $1 FOR UPDATE",
                req.worker,
            )
            state = row["state"] if row else None
            # Forced only with the liveness's evidence: a WorkerReap that anyone else started
            # with forced=true is judged as an automatic reap (CONTRACT.md §5.2).
            forced = req.forced and row is not None and row["force_reap_at"] is not None
            fleet = await conn.fetchrow("SELECT state, recovered_at FROM reaper.fleet WHERE id = 1")
            verdict = fleet_policy.may_reap(
                forced,
                state,
                fleet["state"],
                fleet["recovered_at"],
                req.last_heartbeat_at,
                req.at,
                req.lost_after,
            )
            if not verdict.allowed:
                refused = verdict.refused or "refused"
                if state is None:
                    refused = f"unknown worker {req.worker!r}"
                return ReapResult(refused=refused, retry_at=verdict.retry_at)
            if not forced:
                retry_at = await take_reap_token(
                    conn, req.at, self.settings.reap_rate, self.settings.reap_burst
                )
                if retry_at is not None:
                    return ReapResult(refused="reap rate limit", retry_at=retry_at)
            lost, placed, owed = await replace_tasks(
                conn,
                req.worker,
                "worker-lost",
                req.reason,
                req.actor,
                f"reap of {req.worker}",
                dry_run=req.dry_run,
            )
            if not req.dry_run:
                await conn.execute(
                    "UPDATE reaper.workers SET reaped_at = $2 WHERE name = $1", req.worker, req.at
                )
        if not req.dry_run:
            metrics.count_reaped(len(lost))
        return ReapResult(lost_tasks=lost, replacements=placed, owed=owed)
