"""``reaper drain WORKER --wait``: follow a drain until the worker is drained (CONTRACT.md
§6.2), one line per step of each task's migration (§6.1) as Postgres shows it: its
replacement placed, running, the original stopped. What an autoscaler's termination hook
waits on (docs/rotating-hosts.md).

Drained in Postgres means no task of the worker is ``pending`` or ``running``: the last
original is ``stopped`` there when its replacement runs, and its agent removes it after
that (rule 7), a container within its stop grace period. So the command also waits until
the worker's latest complete report holds no task (its liveness's ``state`` query,
``report_digests``), then says it is drained: a host terminated then cuts no task's
shutdown short. It does not wait for a worker that is lost or retired (no report comes) or
that has never reported its tasks."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from reaper.cli.app import CliError, connect_temporal, console
from reaper.core.config import ConnectionSettings

POLL_S = 1.0
"""How often Postgres is read while following a drain (seconds)."""
WORKER_STATE = "SELECT state FROM reaper.workers WHERE name = $1"
WAITED = ("running", "stalled")
"""Worker states whose host's reports are waited for (a stalled worker may beat again; a
lost or retired one's host is gone or unreachable)."""
QUERY_TIMEOUT_S = 5.0
"""How long the liveness's ``state`` query may take (seconds); no answer: asked again."""


def _clock(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


def steps_of(row: Any) -> list[str]:
    """What a task's row says has happened to it, in order: its replacement placed, that
    running, the task stopped (``policy.explain_drain.MigrationFacts``)."""
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
        CliError: no database to read (not given and no embedded one running), or Temporal
            unreachable when the worker's reports are asked for.
    """
    from reaper.cli import read
    from reaper.cli.commands.workers import find_database_url

    url = find_database_url(settings)
    if url is None:
        raise CliError("--wait: no database (is `reaper run` running? or set --database-url)")
    conn = await read.open_connection(url)
    host = _Host(settings, worker)
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
                state = await conn.fetchval(WORKER_STATE, worker)
                if state in WAITED and await host.holds_tasks() is not False:
                    if not host.told:
                        host.told = True
                        console.print(
                            f"{_clock(now)}  {worker}: no task pending or running;"
                            " waiting for its agent to report the stopped ones gone",
                            highlight=False,
                        )
                    await asyncio.sleep(POLL_S)
                    continue
                cut = [
                    r.task
                    for r in await read.migration_rows(conn, worker, since)
                    if r.stop_reason == "drain-deadline" and r.replacement_state != "running"
                ]
                console.print(f"{_clock(now)}  {worker}: drained", highlight=False)
                if cut:
                    console.print(
                        f"{worker}: the deadline stopped {', '.join(cut)} before a replacement ran",
                        highlight=False,
                    )
                return 1 if cut else 0
            await asyncio.sleep(POLL_S)
    finally:
        await conn.close()


class _Host:
    """Whether ``worker``'s host still holds a task, as its liveness's latest complete report
    says (``state`` query: ``report_digests["tasks"]``)."""

    def __init__(self, settings: ConnectionSettings, worker: str) -> None:
        self.settings = settings
        self.worker = worker
        self.told = False
        self._handle: Any = None

    async def holds_tasks(self) -> bool | None:
        """True while the latest complete report lists a task; False once it lists none, or
        when its agent never sent a task list; ``None`` when the liveness did not answer
        (asked again).

        Raises:
            CliError: Temporal is unreachable.
        """
        from reaper.core.contract import STATE_QUERY, StateView, liveness_id
        from reaper.core.protocol import report_digest

        if self._handle is None:
            client = await connect_temporal(self.settings)
            self._handle = client.get_workflow_handle(liveness_id(self.worker))
        try:
            view: StateView = await self._handle.query(
                STATE_QUERY, result_type=StateView, rpc_timeout=timedelta(seconds=QUERY_TIMEOUT_S)
            )
        except Exception:
            return None
        digest = view.report_digests.get("tasks")
        if digest is None:
            return False
        return digest != report_digest([])
