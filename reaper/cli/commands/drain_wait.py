"""``reaper drain WORKER --wait``: follow a drain until the worker is drained (CONTRACT.md
§6.2), one line per step of each task's migration (§6.1) as Postgres shows it: its
replacement placed, running, the original stopped. What an autoscaler's termination hook
waits on (docs/rotating-hosts.md)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from reaper.cli.app import CliError, console
from reaper.core.config import ConnectionSettings

POLL_S = 1.0
"""How often Postgres is read while following a drain (seconds)."""


def _clock(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


def steps_of(row: Any) -> list[str]:
    """What a task's row says has happened to it, in order: its replacement placed, that
    running, the task stopped (``read.MigrationRow``)."""
    done = []
    if row.replacement is not None:
        where = f"on {row.replacement_worker}" if row.replacement_worker else "owed"
        done.append(f"replacement {row.replacement} placed {where}")
        if row.replacement_state == "running":
            done.append(f"replacement {row.replacement} running {where}")
    if row.state not in ("pending", "running"):
        done.append(f"stopped ({row.stop_reason or row.state})")
    return done


async def follow_drain(
    settings: ConnectionSettings, worker: str, answer: dict[str, Any] | None
) -> int:
    """Print each task's migration steps as they happen until ``worker`` is drained.

    Returns:
        0 once drained; 1 if the drain's deadline stopped a task whose replacement did not
        run, or an undrain ended the drain first.

    Raises:
        CliError: no database to read (not given and no embedded one running).
    """
    from reaper.cli import read
    from reaper.cli.commands.workers import find_database_url

    url = find_database_url(settings)
    if url is None:
        raise CliError("--wait: no database (is `reaper run` running? or set --database-url)")
    conn = await read.open_connection(url)
    shown: dict[str, int] = {}
    try:
        since = await conn.fetchval("SELECT now()")
        while True:
            now = await conn.fetchval("SELECT now()")
            for row in await read.migration_rows(conn, worker, since):
                steps = steps_of(row)
                for line in steps[shown.get(row.task, 0) :]:
                    console.print(f"{_clock(now)}  {row.task}: {line}", highlight=False)
                shown[row.task] = len(steps)
            drain = await read.drain_state(conn, worker)
            if drain is None or not drain.draining:
                console.print(f"{_clock(now)}  {worker}: the drain ended (undrained)")
                return 1
            if drain.drained_at is not None:
                cut = [
                    r.task
                    for r in await read.migration_rows(conn, worker, since)
                    if r.stop_reason == "drain-deadline" and r.replacement_state != "running"
                ]
                console.print(f"{_clock(drain.drained_at)}  {worker}: drained", highlight=False)
                if cut:
                    console.print(
                        f"{worker}: the deadline stopped {', '.join(cut)} before a replacement ran",
                        highlight=False,
                    )
                return 1 if cut else 0
            await asyncio.sleep(POLL_S)
    finally:
        await conn.close()
