"""Activities for agent keys (CONTRACT.md §5.2): the pins in ``reaper.agent_keys``."""

from __future__ import annotations

from temporalio import activity

from activities.base import ActivityBase
from activities.types import PinRequest


class KeyActivities(ActivityBase):
    """Write a worker's pinned Ed25519 public key (``begin_liveness`` reads it)."""

    @activity.defn(name="pin_agent_key")
    async def pin_agent_key(self, req: PinRequest) -> str:
        """Pin ``req.public_key`` for ``req.worker`` unless a key is pinned or enrolled already.

        Returns:
            The key that is pinned now: ``req.public_key``, or the one an operator enrolled
            first (which then wins). Idempotent: a retry returns the same key.
        """
        async with self.pool.acquire() as conn:
            key: str = await conn.fetchval(
                "WITH ins AS (INSERT INTO reaper.agent_keys (worker, public_key)"
                " VALUES ($1, $2) ON CONFLICT (worker) DO NOTHING RETURNING public_key)"
                " SELECT public_key FROM ins"
                " UNION ALL SELECT public_key FROM reaper.agent_keys WHERE worker = $1"
                " LIMIT 1",
                req.worker,
                req.public_key,
            )
            if key is None:  # a concurrent pin committed after this statement's snapshot
                key = await conn.fetchval(
                    "SELECT public_key FROM reaper.agent_keys WHERE worker = $1", req.worker
                )
            return key or req.public_key
