"""Activities of the liveness workflow: worker state, draining, settings, fleet state."""

from __future__ import annotations

from datetime import datetime

from temporalio import activity

from activities.base import ActivityBase, per_kind, write_events
from activities.fleet import refresh_fleet
from activities.types import (
    BeginRun,
    HeartbeatRefresh,
    RecordResult,
    RunStart,
    WorkerRecord,
    WorkerStateChange,
)
from reaper.core import kinds, states
from reaper.core.models import Timings
from reaper.core.policy import migration as migration_policy
from reaper.core.policy import returns
from reaper.core.policy.auth import AuthMode

_CLEAR_MARKS = (
    *per_kind(
        "UPDATE {table} SET missing_since = NULL WHERE worker = $1 AND missing_since IS NOT NULL"
    ).values(),
    "DELETE FROM reaper.dry_marks WHERE worker = $1 AND NOT done",
)
"""What a return clears: every kind's marks of the worker, and its open dry-run marks."""


def _greatest(first: int) -> list[str]:
    """Each kind's ``GREATEST(<kind>_complete_at, $n)``, parameters from ``$first`` in
    ``kinds.ALL`` order (fixed identifiers, never input)."""
    return [f"GREATEST({k.complete_column}, ${first + i})" for i, k in enumerate(kinds.ALL)]


def _set_complete(first: int) -> str:
    """``<kind>_complete_at = GREATEST(...)`` for every kind, parameters from ``$first``."""
    pairs = zip(kinds.ALL, _greatest(first), strict=True)
    return ", ".join(f"{k.complete_column} = {g}" for k, g in pairs)


_WRITE_COMPLETE = (
    f"UPDATE reaper.workers SET {_set_complete(2)} WHERE name = $1"
    f" AND ({kinds.COMPLETE_COLUMNS}) IS DISTINCT FROM ({', '.join(_greatest(2))})"
)
"""Each kind's last complete report ($2.., ``kinds.ALL`` order; ``NULL``: none known), never
moved backwards (``GREATEST`` ignores a ``NULL``); a row it would not change is not written."""


_REFRESH_ROW = (
    f"UPDATE reaper.workers SET last_seq = $3, last_heartbeat_at = $4, {_set_complete(6)}"
    " WHERE name = $1 AND boot_id = $2 AND NOT state = ANY($5::text[])"
    " AND (last_heartbeat_at IS NULL OR last_heartbeat_at < $4) RETURNING true"
)
"""A beat's row refresh (``refresh_heartbeat``): its sequence and time ($3, $4), each kind's
last complete report ($6.., never backwards), guarded by its boot ($2) and by time; never a
row in a terminal state ($5)."""


def _complete(complete_at: dict[str, datetime]) -> list[datetime | None]:
    """``complete_at`` as the parameters of the ``*_complete_at`` columns, in ``kinds.ALL``
    order."""
    return [complete_at.get(k.report) for k in kinds.ALL]


class LivenessActivities(ActivityBase):
    """Activities called by ``WorkerLiveness``."""

    @activity.defn(name="load_timings")
    async def load_timings(self) -> Timings:
        """The durations and switches the workflows run with, from the controller's settings."""
        return Timings.of(self.settings)

    @activity.defn(name="record_worker_state")
    async def record_worker_state(self, change: WorkerStateChange) -> RecordResult:
        """Upsert the ``workers`` row; on a state change write an ``events`` row.

        Called on every state change, a new boot id, and when ``last_heartbeat_at`` would
        otherwise lag by more than half of ``STALL_AFTER`` (CONTRACT.md §5.3). A retired
        worker registering afresh (a new boot) comes back ``running`` and not draining.

        A worker that returns to ``running`` after ``STALL_AFTER`` of silence has all its
        marks cleared once for that return (``change.returned_at``), whether or not its stall
        was recorded: time spent stalled or lost does not count towards ``MISSING_TTL``, and
        its first complete report after the return decides (CONTRACT.md rule 4). The row's
        ``state_since`` becomes the return time, so reports taken before it are skipped by
        ``reconcile_report``. Idempotent: a retry finds the state already written and changes
        nothing more.

        Returns:
            The fleet's state if the worker's state changed (it was recomputed), and
            ``marks_cleared`` if this return's marks are cleared (now or by an earlier
            attempt).
        """
        async with self.pool.acquire() as conn, conn.transaction():
            old = await conn.fetchrow(
                "SELECT state, state_since FROM reaper.workers WHERE name = $1 FOR UPDATE",
                change.worker,
            )
            old_state = old["state"] if old else None
            new_state = change.state.value
            if old is None:
                await conn.execute(
                    "INSERT INTO reaper.workers"
                    " (name, state, boot_id, last_seq, last_heartbeat_at, state_since)"
                    " VALUES ($1, $2, $3, $4, $5, $6)",
                    change.worker,
                    new_state,
                    change.boot_id,
                    change.last_seq,
                    change.last_heartbeat_at,
                    change.at,
                )
            else:
                await conn.execute(
                    "UPDATE reaper.workers SET state = $2,"
                    " state_since = CASE WHEN state = $2 THEN state_since ELSE $6 END,"
                    " draining = CASE WHEN state = ANY($7::text[]) THEN false ELSE draining END,"
                    " boot_id = COALESCE($3, boot_id), last_seq = COALESCE($4, last_seq),"
                    " last_heartbeat_at = COALESCE($5, last_heartbeat_at)"
                    " WHERE name = $1 AND (state, boot_id, last_seq, last_heartbeat_at)"
                    "  IS DISTINCT FROM ($2, COALESCE($3, boot_id), COALESCE($4, last_seq),"
                    "  COALESCE($5, last_heartbeat_at))",
                    change.worker,
                    new_state,
                    change.boot_id,
                    change.last_seq,
                    change.last_heartbeat_at,
                    change.at,
                    states.TERMINAL,
                )
            await conn.execute(_WRITE_COMPLETE, change.worker, *_complete(change.complete_at))
            # The evidence a forced reap needs: this liveness accepted an operator's force_reap.
            await conn.execute(
                "UPDATE reaper.workers SET force_reap_at = $3"
                " WHERE name = $1 AND (force_reap_at IS NULL) = $2",
                change.worker,
                change.forced_reap,
                change.at if change.forced_reap else None,
            )
            if old_state != new_state:
                reason = f"{old_state or 'new'} -> {new_state}"
                if change.reason:
                    reason = f"{reason}: {change.reason}"
                await write_events(
                    conn, change.worker, "worker", "state", [change.worker], reason, change.actor
                )
            marks = returns.marks_at_record(
                old_state, old["state_since"] if old else None, new_state, change.returned_at
            )
            if marks.restamp:
                await conn.execute(
                    "UPDATE reaper.workers SET state_since = $2 WHERE name = $1",
                    change.worker,
                    change.returned_at,
                )
            if marks.clear:
                for sql in _CLEAR_MARKS:
                    await conn.execute(sql, change.worker)
            if old is not None and migration_policy.return_undrains(old_state, new_state):
                await conn.execute(
                    "UPDATE reaper.workers SET drained_at = NULL WHERE name = $1", change.worker
                )
            fleet = None
            if old_state != new_state:
                fleet = await refresh_fleet(conn, self.settings.disruption_threshold, change.at)
            return RecordResult(fleet=fleet, marks_cleared=marks.cleared)

    @activity.defn(name="refresh_heartbeat")
    async def refresh_heartbeat(self, beat: HeartbeatRefresh) -> bool:
        """Write a later ``last_seq`` and ``last_heartbeat_at`` to the worker's row, one
        statement, nothing else (CONTRACT.md §5.3: the row lags the liveness by at most
        ``STALL_AFTER``).

        Run as a local activity by the liveness when only the lag calls for a write
        (``policy.liveness.row_refresh_due``): no activity task and no workflow task of its
        own, so the steady beats of a fleet cost Temporal one signal each (issue 11, bench
        metric 4). Guarded by the boot it refreshes and by time, so a retry, or a refresh
        that lands after a newer state record, changes nothing.

        Returns:
            True if the row was written.
        """
        written = await self.pool.fetchval(
            _REFRESH_ROW,
            beat.worker,
            beat.boot_id,
            beat.last_seq,
            beat.last_heartbeat_at,
            states.TERMINAL,
            *_complete(beat.complete_at),
        )
        return bool(written)

    @activity.defn(name="worker_record")
    async def worker_record(self, worker: str) -> WorkerRecord:
        """What Postgres holds of a worker: its state and boot id (``state`` ``None`` if
        unknown). A new liveness run reads it to ignore the beats of a retired boot."""
        row = await self.pool.fetchrow(
            "SELECT state, boot_id FROM reaper.workers WHERE name = $1", worker
        )
        if row is None:
            return WorkerRecord()
        return WorkerRecord(state=row["state"], boot_id=row["boot_id"])

    @activity.defn(name="begin_liveness")
    async def begin_liveness(self, req: BeginRun) -> RunStart:
        """Everything a liveness run reads before it acts, in one round trip (registering
        a worker costs one activity instead of two local ones and another, issue 11): the timings
        (:meth:`load_timings`), the pinned key (when authentication is on and the run has
        none) and, on a first run, the ``workers`` row
        (:meth:`worker_record`). Reads only: a retry changes nothing."""
        timings = Timings.of(self.settings)
        want_key = timings.agent_auth is not AuthMode.off and not req.key_known
        row = await self.pool.fetchrow(
            "SELECT w.state, w.boot_id, k.public_key, w.name IS NOT NULL AS known"
            " FROM (SELECT $1::text AS name) n"
            " LEFT JOIN reaper.workers w ON w.name = n.name"
            " LEFT JOIN reaper.agent_keys k ON k.worker = n.name",
            req.worker,
        )
        record = None
        if req.first:
            record = (
                WorkerRecord(state=row["state"], boot_id=row["boot_id"])
                if row["known"]
                else WorkerRecord()
            )
        return RunStart(
            timings=timings, agent_key=row["public_key"] if want_key else None, record=record
        )
