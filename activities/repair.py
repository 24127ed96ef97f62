"""Repair of a stuck liveness: the controller does what the stuck-liveness runbook says.

A ``WorkerLiveness`` whose history the current code cannot replay fails every workflow task
for ever (docs/stale-clock.md: the cause is outside reaper, a task that ran
with a stale clock after a Temporal restart). The fleet monitor runs
:meth:`RepairActivities.repair_stuck` at every check: it reads the suspect ``workers``
rows (:data:`SUSPECTS`), describes each one's liveness, and resets
a stuck one (``is_stuck``, and its history fails to replay with a nondeterminism error) to
the latest workflow task the current code can replay (``latest_replayable``), with its
later signals reapplied. One ``events`` row (``worker``, ``repaired``) and one log line per
reset.

The replay is injected (``activities.diagnosis.ReplayCheck``), because this package may not
import the workflows (import layers, docs/architecture.md): ``worker.py`` builds it from
``workflows.ALL_WORKFLOWS`` and the pydantic data converter.

Resetting re-runs what the liveness did after the reset point. That is safe: every activity
is idempotent (guarded by the state it expects), and child ids come from data: a collector
started after the point is found running again (``WorkflowAlreadyStartedError``, handled in
``workflows/intake.py``), a reap is started again under the same id once the first has
completed (a reap is one short activity; the repair comes at least
``policy.repair.suspect_after`` after the liveness stopped completing tasks) and finds its
tasks already ``lost``. Nothing is destroyed twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime

import asyncpg
from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities import metrics
from activities.base import ActivityBase, write_events
from activities.diagnosis import ReplayCheck, diagnose, recent_task_outcomes
from activities.types import RepairResult
from reaper.core.config import Settings
from reaper.core.contract import WorkerState, liveness_id
from reaper.core.policy import repair as policy

log = logging.getLogger("reaper.repair")

SUSPECTS = (
    "SELECT name FROM reaper.workers"
    " WHERE (state = ANY($1::text[]) AND last_heartbeat_at < $2)"
    " OR (state = $5 AND state_since < $4)"
    " ORDER BY random() LIMIT $3"
)
"""Up to $3 suspect workers: state in $1 and last heartbeat before $2, or lost ($5) since
before $4 (``policy.repair.suspect_cutoff`` and ``retire_cutoff``), in random order, so that
suspects which are not stuck (an outage grace, a liveness terminated by hand) never starve a
stuck one. This statement is the rule; tests/support/rule_models.py models it row by row."""


async def find_suspects(
    db: asyncpg.Pool | asyncpg.Connection, cutoff: datetime, limit: int, retire_by: datetime
) -> list[str]:
    """Up to ``limit`` suspect workers (:data:`SUSPECTS`), in random order.

    Args:
        cutoff: ``policy.repair.suspect_cutoff`` (UTC): running or stalled rows whose last
            heartbeat is older are suspect.
        retire_by: ``policy.repair.retire_cutoff`` (UTC): lost rows lost since before it are.
    """
    states = sorted(policy.REPAIRABLE_STATES)
    lost = WorkerState.lost.value
    return [r["name"] for r in await db.fetch(SUSPECTS, states, cutoff, limit, retire_by, lost)]


BATCH = 10
"""Suspects looked at per check: one ``describe`` each."""
BUDGET_S = 30.0
"""Seconds of work per check after which no further suspect is started (a replay of the
largest history, ``HISTORY_CAP`` events, takes about 3 s here: 0.24 s for 679 events)."""
HEARTBEAT_EVERY_S = 5.0
"""The activity heartbeats this often, so a controller that dies in a long replay is noticed
at the heartbeat timeout (``workflows/fleet.py``), not at the end of ``start_to_close``."""
REQUEST_NAMESPACE = uuid.UUID("6f0d7c55-3c1e-4a57-9d4b-2a37c1e0a9b1")
"""uuid5 namespace of reset request ids."""


def repair_key(workflow_id: str, run_id: str) -> str:
    """The key of one repair: a run is reset at most once (the ``events`` row's ``dedupe``)."""
    return f"repaired:{workflow_id}:{run_id}"


@contextlib.asynccontextmanager
async def heartbeating() -> AsyncIterator[None]:
    """Heartbeat the current activity every :data:`HEARTBEAT_EVERY_S` while in the block."""

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(HEARTBEAT_EVERY_S)

    task = asyncio.get_running_loop().create_task(beat())
    try:
        yield
    finally:
        task.cancel()


class RepairActivities(ActivityBase):
    """The fleet monitor's repair of stuck livenesses.

    Args:
        pool, settings, gc_pool: as :class:`activities.base.ActivityBase`.
        replay: replays a history on the controller's workflows (``ReplayCheck``);
            ``None``: stuck livenesses are found and logged but never reset (no reset point
            can be proven without it).
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: Settings,
        gc_pool: asyncpg.Pool | None = None,
        replay: ReplayCheck | None = None,
    ) -> None:
        super().__init__(pool, settings, gc_pool)
        self.replay = replay

    @activity.defn(name="repair_stuck")
    async def repair_stuck(self, at: datetime) -> RepairResult:
        """Find stuck livenesses and reset each to the latest point the code can replay.

        Reads up to :data:`BATCH` suspect workers with one query; for each, describes its
        liveness; a stuck one (``policy.repair.is_stuck``) whose history fails to replay with
        a nondeterminism error is reset to ``policy.repair.latest_replayable`` (signals and
        updates after it reapplied), one ``events`` row ``repaired`` written in the same
        transaction, with the event id and the error as its reason. One whose history
        replays and whose last task timed out is not stuck. A stuck liveness with no
        replayable point, whose history fails to replay for another cause, or whose tasks
        fail although it replays, is left alone and logged
        (``reaper_livenesses_unrepairable_total``). Repairs in a dry run too: a reset
        changes reaper's own workflow, none of the scheduler's rows.

        Idempotent: the row's ``dedupe`` key comes from the stuck run's id, and only the
        current open run is reset (:meth:`reset_once`): a retry neither resets twice nor
        writes a second row. A crash after the reset and before the commit leaves the reset
        without its row and log line.

        A Temporal error on one liveness (a describe, a history read, a reset) is logged
        and that liveness is tried again at the next check; the others go on.

        Args:
            at: the controller's (workflow) time, UTC: suspects are judged against it.

        Returns:
            How many suspects were looked at, the workers whose liveness was reset, and
            those found stuck and left alone.

        Raises:
            asyncpg.PostgresError, OSError: Postgres failed (the activity is retried).
        """
        s = self.settings
        cutoff = policy.suspect_cutoff(at, s.heartbeat_interval, s.stall_after, s.lost_after)
        retire_by = policy.retire_cutoff(at, s.heartbeat_interval, s.retire_after)
        names = await find_suspects(self.pool, cutoff, BATCH, retire_by)
        result = RepairResult(suspects=len(names))
        client = activity.client()
        started = time.monotonic()
        async with heartbeating():
            for worker in names:
                if time.monotonic() - started > BUDGET_S:
                    break
                try:
                    outcome = await self._repair(client, worker)
                except RPCError as exc:  # one liveness Temporal would not serve: the others
                    log.warning(
                        "%s: repair check failed (%s); the next check tries again",
                        worker,
                        exc,
                        extra={"worker": worker, "action": "repair"},
                    )
                    continue
                if outcome is True:
                    result.repaired.append(worker)
                elif outcome is False:
                    result.unrepairable.append(worker)
        metrics.count_repaired(len(result.repaired))
        metrics.count_unrepairable(len(result.unrepairable))
        return result

    async def _repair(self, client: Client, worker: str) -> bool | None:
        """Repair ``worker``'s liveness if it is stuck: True if reset, False if stuck and
        left alone, ``None`` if not stuck after all (or reset already by an earlier
        attempt)."""
        wid = liveness_id(worker)
        try:
            desc = await client.get_workflow_handle(wid).describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        raw = desc.raw_description
        attempt = raw.pending_workflow_task.attempt if raw.HasField("pending_workflow_task") else 0
        running = desc.status == WorkflowExecutionStatus.RUNNING
        run_id = desc.run_id
        if not running:
            return None
        # A worker that keeps beating schedules a new task at attempt 1 after each failure:
        # the failures at the end of the history count too (one page read from the end).
        failed = policy.failures_in_a_row(await recent_task_outcomes(client, wid, run_id))
        if not policy.is_stuck(running, attempt, failed):
            return None
        history = await client.get_workflow_handle(wid, run_id=run_id).fetch_history()
        fields = {"worker": worker, "workflow_id": wid, "action": "repair"}
        if self.replay is None:
            log.error("%s: liveness stuck; no replay check here, not reset", worker, extra=fields)
            return False
        found = await diagnose(history, self.replay)
        verdict = policy.repair_verdict(
            found.failure is not None, found.nondeterministic, found.point, failed
        )
        if verdict is policy.Verdict.not_stuck:
            log.info(
                "%s: workflow task attempt %s, but its history replays and no task failed:"
                " not stuck",
                worker,
                attempt,
                extra=fields,
            )
            return None
        if verdict is policy.Verdict.unrepairable:
            log.error(
                "%s: liveness stuck (workflow task attempt %s, %s failed in a row), no reset"
                " helps: %s",
                worker,
                attempt,
                failed,
                found.failure or "its tasks fail although its history replays",
                extra=fields,
            )
            return False
        assert found.point is not None
        reason = (
            f"reset to event {found.point} (run {run_id}): workflow task failed"
            f" {max(failed, attempt - 1)} times: {str(found.failure)[:300]}"
        )
        return await self.reset_once(client, worker, run_id, found.point, reason)

    async def reset_once(
        self, client: Client, worker: str, run_id: str, point: int, reason: str
    ) -> bool | None:
        """Reset run ``run_id`` of ``worker``'s liveness to event ``point`` (a
        ``WorkflowTaskCompleted``), signals after it reapplied, and write its ``events`` row
        (``reason``), in one transaction; at most once per run.

        Only the workflow's current, open run is reset: a run that a reset (this one's,
        retried after a crash before the commit; an operator's) has replaced is left alone.
        Temporal's own deduplication of the request id does not cover that: the dev server
        (1.32) reset a second time for the same request id once the first reset's run was
        current (tests/e2e/test_repair.py).

        Returns:
            True if this call reset the run; ``None`` if its row exists already, or the run
            is no longer the current open one.

        Raises:
            RPCError: Temporal refused the reset (the transaction rolls back, no row).
        """
        wid = liveness_id(worker)
        key = repair_key(wid, run_id)
        async with self.pool.acquire() as conn, conn.transaction():
            # Attempts of this activity that overlap (a retry after a heartbeat timeout)
            # take turns; the second finds the row, or the run replaced.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", key)
            if await conn.fetchval("SELECT 1 FROM reaper.events WHERE dedupe = $1", key):
                return None
            now = await client.get_workflow_handle(wid).describe()
            if now.run_id != run_id or now.status != WorkflowExecutionStatus.RUNNING:
                return None
            await client.workflow_service.reset_workflow_execution(
                ResetWorkflowExecutionRequest(
                    namespace=client.namespace,
                    workflow_execution=WorkflowExecution(workflow_id=wid, run_id=run_id),
                    reason=f"reaper: {reason}",
                    workflow_task_finish_event_id=point,
                    request_id=str(uuid.uuid5(REQUEST_NAMESPACE, key)),
                    # Default reapply type: every signal (and update) after the point is
                    # applied again to the new run.
                    identity=client.identity,
                )
            )
            await write_events(
                conn, worker, "worker", "repaired", [worker], reason, "reaper", dedupe=[key]
            )
        return True
