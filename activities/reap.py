"""Reaping a lost (or force-reaped) worker: its tasks ``lost``, its services backfilled."""

from __future__ import annotations

from datetime import datetime, timedelta

import asyncpg

from temporalio import activity

from activities.base import ActivityBase, write_events
from activities.placement import backfill
from activities.types import ReapRequest
from reaper.core.models import ReapResult


async def take_reap_token(
    conn: asyncpg.Connection, at: datetime, rate: float, burst: int
) -> datetime | None:
    """Take one token from the fleet-wide reap bucket; ``None`` if taken, else when to retry.

    A token bucket of ``burst`` tokens refilled at ``rate`` per second (Kubernetes' node
    eviction rate limiter). ``at`` is the controller's time, UTC. Runs in the caller's
    transaction with the bucket row locked.
    """
    row = await conn.fetchrow(
        "SELECT tokens, updated_at FROM reaper.reap_tokens WHERE id = 1 FOR UPDATE"
    )
    tokens = float(burst) if row["tokens"] is None else row["tokens"]
    if row["updated_at"] is not None:
        elapsed = max((at - row["updated_at"]).total_seconds(), 0.0)
        tokens = min(float(burst), tokens + elapsed * rate)
    if tokens < 1.0:
        return at + timedelta(seconds=(1.0 - tokens) / rate)
    await conn.execute(
        "UPDATE reaper.reap_tokens SET tokens = $1, updated_at = $2 WHERE id = 1",
        tokens - 1.0, at,
    )
    return None


class ReapActivities(ActivityBase):
    """Activities called by ``WorkerReap`` (``reap-{worker}-{n}``)."""

    @activity.defn(name="reap_worker")
    async def reap_worker(self, req: ReapRequest) -> ReapResult:
        """Reap ``req.worker`` in one transaction (CONTRACT.md rules 5 and 6).

        Its ``running`` and ``pending`` tasks become ``lost`` (``stop_reason`` ``worker-lost``,
        an ``events`` row each carrying ``req.reason``), and each affected service is backfilled
        with replacement ``pending`` tasks on healthy, non-draining workers.

        An automatic reap (``forced`` false) is refused while the fleet is in full disruption,
        and while the worker has not yet been silent for ``lost_after`` seconds since the fleet
        last recovered (every worker gets a fresh ``LOST_AFTER``); ``refused`` says why and
        ``retry_at`` when to try again. A forced reap (operator) bypasses both.

        Idempotent: a retry finds no running task left and each service already at its count.
        """
        async with self.pool.acquire() as conn, conn.transaction():
            state = await conn.fetchval(
                "SELECT state FROM reaper.workers WHERE name = $1 FOR UPDATE", req.worker
            )
            if state is None:
                return ReapResult(refused=f"unknown worker {req.worker!r}")
            if not req.forced:
                if state != "lost":
                    return ReapResult(refused=f"worker is {state}, not lost")
                fleet = await conn.fetchrow(
                    "SELECT state, recovered_at FROM reaper.fleet WHERE id = 1"
                )
                if fleet["state"] == "full":
                    return ReapResult(refused="fleet in full disruption")
                recovered = fleet["recovered_at"]
                last = req.last_heartbeat_at
                if recovered is not None and (last is None or last < recovered):
                    fresh_until = recovered + timedelta(seconds=req.lost_after)
                    if req.at < fresh_until:
                        return ReapResult(
                            refused="fleet recovering: fresh LOST_AFTER", retry_at=fresh_until
                        )
                retry_at = await take_reap_token(
                    conn, req.at, self.settings.reap_rate, self.settings.reap_burst
                )
                if retry_at is not None:
                    return ReapResult(refused="reap rate limit", retry_at=retry_at)
            if req.dry_run:
                rows = await conn.fetch(
                    "SELECT id, service FROM reaper.tasks"
                    " WHERE worker = $1 AND state IN ('running', 'pending') ORDER BY id",
                    req.worker,
                )
            else:
                rows = await conn.fetch(
                    "UPDATE reaper.tasks SET state = 'lost', stop_reason = 'worker-lost',"
                    " missing_since = NULL"
                    " WHERE worker = $1 AND state IN ('running', 'pending') RETURNING id, service",
                    req.worker,
                )
            lost = sorted(r["id"] for r in rows)
            await write_events(
                conn, req.worker, "task", "lost", lost, req.reason, req.actor,
                dry_run=req.dry_run,
            )
            services = [r["service"] for r in rows]
            placed, unplaced = await backfill(
                conn, services, f"reap of {req.worker}", req.actor,
                dry_run=req.dry_run, assume_inactive=services if req.dry_run else (),
            )
            return ReapResult(lost_tasks=lost, replacements=placed, unplaced=unplaced)
