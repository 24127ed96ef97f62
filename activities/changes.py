"""The change feed: a worker whose rows changed gets its next reports diffed (§5.3).

Triggers on the handle tables (migration 007) append one ``reaper.row_changes`` row per
statement and worker whenever anyone but the collector inserts, deletes, moves or changes
the state of a row. The fleet monitor runs :meth:`ChangeActivities.nudge_changed` every
heartbeat interval: it takes those rows and signals ``nudge`` to each changed worker's
liveness, which then forwards that worker's next complete reports of the changed kinds to
its collector even if they are unchanged. This replaces diffing every unchanged report every
``RESYNC_INTERVAL`` (BENCHMARKS.md metric 1: that resync cost half the heartbeat
throughput); ``FULL_RESYNC_INTERVAL`` is the safety net for changes the feed cannot see.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict

from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.base import ActivityBase
from reaper.core.contract import fleet_monitor_id, liveness_id
from reaper.core.policy import rollout

log = logging.getLogger(__name__)

TAKE = (
    "DELETE FROM reaper.row_changes WHERE id IN"
    " (SELECT id FROM reaper.row_changes ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)"
    " RETURNING worker, kind"
)
"""Take up to $1 changes, oldest first. Rows a concurrent take holds are skipped."""
BATCH = 5_000
"""Changes taken per transaction."""
BUDGET_S = 8.0
"""Seconds of signalling per attempt, well inside the activity's 15 s: a burst of changes
larger than this is taken over several runs of the fleet monitor's loop."""
IN_FLIGHT = 32
"""Signals sent at once."""


async def nudge(client: Client, worker: str, kinds: list[str]) -> bool:
    """Signal ``nudge`` with ``kinds`` to ``worker``'s liveness; False if it has none running.

    Raises:
        RPCError: Temporal did not take the signal (the caller's transaction rolls back and
            the changes are taken again on the retry).
    """
    try:
        await client.get_workflow_handle(liveness_id(worker)).signal("nudge", kinds)
        return True
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:  # never beat, or retired: nothing to diff
            return False
        raise


async def nudge_all(client: Client, changed: dict[str, set[str]]) -> list[bool]:
    """:func:`nudge` every worker of ``changed`` (worker -> kinds), ``IN_FLIGHT`` at once."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(worker: str, kinds: set[str]) -> bool:
        async with gate:
            return await nudge(client, worker, sorted(kinds))

    return await asyncio.gather(*(one(w, k) for w, k in sorted(changed.items())))


class ChangeActivities(ActivityBase):
    """The change feed's one activity, run by ``FleetMonitor``."""

    @activity.defn(name="nudge_changed")
    async def nudge_changed(self, _: None = None) -> int:
        """Take the recorded row changes and nudge each changed worker's liveness.

        Each batch is deleted and its signals sent in one transaction: if a signal fails
        the transaction rolls back and the changes stay for the retry, so no change is
        lost; one whose signal went out but whose delete did not commit is signalled again,
        which is harmless (a ``nudge`` only asks for a diff). Idempotent in that sense.

        Returns:
            How many workers were nudged (a worker nudged in two batches counts twice).
        """
        client = activity.client()
        started = time.monotonic()
        nudged = 0
        while time.monotonic() - started < BUDGET_S:
            async with self.pool.acquire() as conn, conn.transaction():
                rows = await conn.fetch(TAKE, BATCH)
                changed: dict[str, set[str]] = defaultdict(set)
                for r in rows:
                    changed[r["worker"]].add(r["kind"])
                sent = await nudge_all(client, changed)
            nudged += sum(sent)
            if len(rows) < BATCH:
                break
        return nudged


async def wake_upkeep(peer_version: str) -> None:
    """Ask the fleet monitor of this activity's task queue to run its upkeep now rather than
    at its next heartbeat-interval tick (signal ``upkeep``, an internal name): a migration's
    next step is due (``activities.migration.upkeep_due``). Sent only once every peer
    controller is of the 1.2 line (``peer_version``, ``rollout.ROTATING_HOSTS``): a 1.1
    monitor would ignore it, and a monitor woken early gives commands a 1.1 replica would
    not give on its history. Best effort: a failure is logged, the tick still comes."""
    if not rollout.uses(rollout.ROTATING_HOSTS, peer_version):
        return
    queue = activity.info().task_queue
    try:
        await activity.client().get_workflow_handle(fleet_monitor_id(queue)).signal("upkeep")
    except Exception as exc:  # the upkeep's tick is the fallback
        log.info("waking the fleet monitor of %s failed: %s", queue, exc)
