"""The fleet as a whole: its disruption state (rule 6), owed work (§5.1) and stray tasks."""

from __future__ import annotations

from datetime import datetime

import asyncpg
from temporalio import activity

from activities import metrics, migration
from activities.base import ActivityBase, write_events
from activities.tasks import place_owed, replace_tasks
from activities.types import FleetView, UpkeepResult
from reaper.core import states
from reaper.core.policy.fleet import FleetState, fleet_state
from reaper.core.states import HEALTHY, UNHEALTHY

FLEET_STATE = "SELECT state FROM reaper.fleet WHERE id = 1"
DRAINED_TOLD = "drained:"
"""Prefix of the ``placed`` entry ``(drained:W, W)`` by which the upkeep asks the fleet
monitor to tell worker W's liveness that it is drained (§6.2)."""


async def refresh_fleet(conn: asyncpg.Connection, threshold: float, at: datetime) -> FleetView:
    """Recompute the fleet's disruption state from ``reaper.workers`` and store it if changed.

    Retired workers count neither way (§5.1). When the fleet leaves ``full`` disruption,
    ``recovered_at`` is set: every worker then gets
    a fresh ``LOST_AFTER`` before it can be reaped (CONTRACT.md rule 6). Runs inside the
    caller's transaction; the fleet row is locked so concurrent callers serialise.
    ``at`` is the controller's (workflow) time of the change, UTC.
    """
    row = await conn.fetchrow(
        "SELECT state, since, recovered_at FROM reaper.fleet WHERE id = 1 FOR UPDATE"
    )
    counts = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE state = ANY($1::text[])) AS healthy,"
        " count(*) FILTER (WHERE state = ANY($2::text[])) AS unhealthy FROM reaper.workers",
        list(HEALTHY),
        list(UNHEALTHY),
    )
    new = fleet_state(counts["healthy"], counts["unhealthy"], threshold)
    since, recovered_at = row["since"], row["recovered_at"]
    if new.value != row["state"]:
        recovering = row["state"] == FleetState.full.value
        stamp = await conn.fetchval(
            "UPDATE reaper.fleet SET state = $1, since = $3,"
            " recovered_at = CASE WHEN $2 THEN $3 ELSE recovered_at END"
            " WHERE id = 1 RETURNING since",
            new.value,
            recovering,
            at,
        )
        since = stamp
        if recovering:
            recovered_at = stamp
        await write_events(
            conn,
            None,
            "worker",
            "fleet",
            [None],
            f"{row['state']} -> {new.value} ({counts['unhealthy']} of "
            f"{counts['healthy'] + counts['unhealthy']} unhealthy)",
        )
    return FleetView(
        state=new.value,
        healthy=counts["healthy"],
        unhealthy=counts["unhealthy"],
        since=since,
        recovered_at=recovered_at,
    )


STRAY_HOSTS = (
    "SELECT w.name, w.state FROM reaper.workers w"
    " WHERE w.state = ANY($1::text[])"
    "  AND (w.state = ANY($2::text[])"
    "   OR (w.reaped_at IS NOT NULL AND w.reaped_at >= w.state_since))"
    " AND EXISTS (SELECT 1 FROM reaper.tasks t"
    "  WHERE t.worker = w.name AND t.state = ANY($3::text[]))"
    " ORDER BY w.name FOR UPDATE OF w"
)
"""Workers that hold strays (Kubernetes #12545): in a state that holds no tasks ($1,
``states.HOLDS_NO_TASKS``), terminal ($2: retired) or reaped since they entered it (lost and
reaped), with active tasks ($3) a scheduler with a stale view still placed there."""


class FleetActivities(ActivityBase):
    """Activities called by ``FleetMonitor`` (``reaper-fleet``) and the liveness workflows."""

    @activity.defn(name="fleet_status")
    async def fleet_status(self, at: datetime) -> FleetView:
        """The fleet's current disruption state (recomputed, stored if it changed)."""
        async with self.pool.acquire() as conn, conn.transaction():
            return await refresh_fleet(conn, self.settings.disruption_threshold, at)

    @activity.defn(name="fleet_upkeep")
    async def fleet_upkeep(self, at: datetime) -> UpkeepResult:
        """Place owed work and reap strays; the fleet monitor runs it every heartbeat interval.

        Owed replacements (``pending``, no worker) go to placeable workers (§5.1: within
        ``2 x HEARTBEAT_INTERVAL`` of one becoming available). Tasks a scheduler wrote
        ``running`` or ``pending`` onto a worker that is lost and reaped, or retired, are
        reaped and replaced (:data:`STRAY_HOSTS`; Kubernetes #12545), except in full
        disruption. Nothing happens in a dry run. Idempotent: each change is guarded.

        Args:
            at: the controller's (workflow) time, UTC.

        Returns:
            Tasks placed (``(task_id, worker)``), for the monitor to tell those workers.
        """
        if self.settings.dry_run:
            return UpkeepResult()
        async with self.pool.acquire() as conn, conn.transaction():
            strays, reaped = await self._reap_strays(conn)
            placed = await place_owed(conn)
            full = await conn.fetchval(FLEET_STATE) == FleetState.full
            moved = await migration.migrate(conn, at, full)
        metrics.count_reaped(reaped)
        metrics.count_migrations("replaced", moved.replaced)
        metrics.count_migrations("deadline", moved.deadline)
        # Drained workers' livenesses are told as workers that received tasks are: entries
        # of `placed`, which every release's fleet monitor signals (a new field would give
        # this release's monitor commands a 1.1.0 replica does not give on its history).
        told = [(f"{DRAINED_TOLD}{w}", w) for w in moved.drained]
        return UpkeepResult(placed=[*strays, *placed, *moved.placed, *told])

    async def _reap_strays(self, conn: asyncpg.Connection) -> tuple[list[tuple[str, str]], int]:
        """Reap stray tasks (:data:`STRAY_HOSTS`) and backfill their services.

        Returns the replacements placed (``(task_id, worker)``) and how many strays were reaped.
        """
        if await conn.fetchval(FLEET_STATE) == FleetState.full:
            return [], 0
        hosts = await conn.fetch(
            STRAY_HOSTS, states.HOLDS_NO_TASKS, states.TERMINAL, states.ACTIVE_TASKS
        )
        placed: list[tuple[str, str]] = []
        reaped = 0
        for host in hosts:
            stop = "worker-retired" if states.worker(host["state"]).terminal else "worker-lost"
            lost, more, _ = await replace_tasks(
                conn,
                host["name"],
                stop,
                f"stray: task on a {host['state']} worker",
                "reaper",
                f"stray on {host['name']}",
            )
            placed += more
            reaped += len(lost)
        return placed, reaped
