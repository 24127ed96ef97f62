"""Rows left ``creating`` past ``CREATING_TIMEOUT``: their creator crashed (Concourse fails
such containers too). Called by ``reconcile_report`` inside its transaction."""

from __future__ import annotations

from datetime import datetime, timedelta

import asyncpg

from activities import collection_sql as sql
from activities.base import EVENT_KIND, column, write_events
from activities.types import ReconcileInput
from reaper.core import states
from reaper.core.policy import collection as policy


async def fail_stuck_creating(
    conn: asyncpg.Connection, inp: ReconcileInput, stall_after: float
) -> tuple[list[str], datetime | None]:
    """Fail and collect the rows still being created ``CREATING_TIMEOUT`` after they
    entered that state (their creator crashed; Concourse fails such containers too):
    deleted, one ``destroyed`` event each (reason ``creating-timeout``), except in full
    disruption (rule 6).

    Returns:
        The handles collected (in a dry run, those that would be), and when the next one
        falls due (UTC), if any: the oldest row still being created times out then; rows a
        full disruption held are looked at again ``STALL_AFTER`` later (as a refused
        destroy is).
    """
    cutoff = inp.taken_at - timedelta(seconds=inp.creating_timeout)
    held = await conn.fetchval(sql.FLEET_STATE) == "full"
    stuck: list[str] = []
    if not held:
        statement = (sql.WOULD_FAIL_STUCK_CREATING if inp.dry_run else sql.FAIL_STUCK_CREATING)[
            inp.kind
        ]
        stuck = await column(conn, statement, inp.worker, cutoff, states.BEING_CREATED)
    row = await conn.fetchrow(sql.CREATING[inp.kind], inp.worker, states.BEING_CREATED, cutoff)
    due = policy.creating_due(row["upcoming"], inp.creating_timeout)
    if held and row["overdue"]:
        due = policy.recheck_at(due, inp.taken_at + timedelta(seconds=stall_after))
    await write_events(
        conn,
        inp.worker,
        EVENT_KIND[inp.kind],
        "destroyed",
        stuck,
        "creating-timeout",
        dry_run=inp.dry_run,
        dedupe=[f"stuck:{inp.worker}:{inp.kind}:{h}" for h in stuck] if inp.dry_run else None,
    )
    return stuck, due
