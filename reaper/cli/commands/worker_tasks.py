"""``reaper workers --tasks``: which task runs where, from Postgres (CONTRACT.md §3).

Every ``pending`` or ``running`` task under the worker it is placed on (``owed``: a
replacement no worker could take yet, CONTRACT.md §5.1), with its service and since when
it is in its state. Read through :mod:`reaper.cli.read`; this module holds no SQL.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.table import Table

from reaper.cli.app import console
from reaper.core.policy.explain import clock

OWED = "(owed)"
"""The worker column of a task placed nowhere yet."""


async def tasks_by_worker(url: str, notes: list[str]) -> dict[str, list[dict[str, Any]]] | None:
    """``{worker: [{"id", "service", "state", "since"}, ...]}``, owed tasks under
    :data:`OWED`; ``None`` with a note when Postgres cannot be read."""
    from reaper.cli import read

    try:
        conn = await read.open_connection(url, timeout_s=5)
        try:
            rows = await read.active_tasks(conn)
        finally:
            await conn.close()
    except Exception as exc:
        text = str(exc).splitlines()[0] if str(exc) else repr(exc)
        notes.append(f"tasks unknown (Postgres: {text})")
        return None
    out: dict[str, list[dict[str, Any]]] = {}
    for t in rows:
        out.setdefault(t.worker or OWED, []).append(
            {"id": t.id, "service": t.service, "state": t.state, "since": t.since.isoformat()}
        )
    return out


def print_tasks(tasks: dict[str, list[dict[str, Any]]]) -> None:
    """The tasks table: worker, task, service, state and since when (UTC), one row per task."""
    count = sum(len(v) for v in tasks.values())
    if not count:
        console.print("no pending or running tasks")
        return
    table = Table(title=f"{count} tasks by worker")
    for col in ("worker", "task", "service", "state", "since"):
        table.add_column(col)
    for worker, rows in tasks.items():
        for i, t in enumerate(rows):
            since = clock(datetime.fromisoformat(t["since"]).astimezone(UTC))
            style = "green" if t["state"] == "running" else "yellow"
            table.add_row(
                worker if i == 0 else "",
                t["id"],
                t["service"] or "-",
                f"[{style}]{t['state']}[/]",
                since,
            )
    console.print(table)
