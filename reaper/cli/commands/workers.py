"""``reaper workers``: the fleet, one row per running liveness workflow.

Each worker's ``state`` comes from its liveness query; running-task counts and the fleet's
disruption state come from Postgres through :mod:`reaper.cli.read`. Retired workers
(CONTRACT.md §5.1) are out of the fleet and hidden; ``--all`` lists them too, from their
``workers`` rows (their liveness has completed).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import typer

from reaper.cli.agent_connection import query_state
from reaper.cli.app import (
    ADDRESS_OPTION,
    DATABASE_URL_OPTION,
    NAMESPACE_OPTION,
    STATE_DIR_OPTION,
    CliError,
    app,
    connect_temporal,
    connection_settings_from,
    exit_now,
    fail,
    progress,
)
from reaper.cli.commands.workers_table import print_overview, report_fields
from reaper.core.config import ConfigError, ConnectionSettings, Settings, load_settings
from reaper.core.contract import LIVENESS_WORKFLOW, StateView

if TYPE_CHECKING:
    from reaper.cli import read

QUERY_CONCURRENCY = 16
"""At most this many ``state`` queries in flight for ``reaper workers``."""
QUERY_TIMEOUT_S = 5.0
"""Deadline of one worker's ``state`` query, in seconds."""


DEFAULT_RESYNC_S = float(Settings.model_fields["resync_interval"].default)
"""``REAPER_RESYNC_INTERVAL``'s default, seconds (``reaper.core.config``)."""


def resync_interval_of() -> tuple[float, str | None]:
    """``REAPER_RESYNC_INTERVAL`` as this shell's settings say (the controller's, when they
    share a ``.env``), and a note when they could not be read: then its default. ``reaper
    workers`` only reads and must not be stopped by a controller timing out of range."""
    try:
        return load_settings().resync_interval, None
    except ConfigError as exc:
        note = f"RESYNC_INTERVAL taken as its default {DEFAULT_RESYNC_S:g}s ({exc})"
        return DEFAULT_RESYNC_S, note


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else repr(exc)


def find_database_url(settings: ConnectionSettings) -> str | None:
    """The configured URL, or the embedded server's if it is running (never starts one)."""
    if settings.database_url:
        return settings.database_url
    from reaper.kit.postgres import EmbeddedPostgres

    return EmbeddedPostgres(Path(settings.state_dir).resolve() / "postgres").running_url()


class _PostgresView(NamedTuple):
    """What ``reaper workers`` reads from Postgres (each ``None`` when it could not)."""

    running: dict[str, int] | None = None
    fleet: dict[str, Any] | None = None
    retired: list[read.RetiredWorker] | None = None
    reports: dict[str, read.ReportTimes] | None = None


async def _postgres_view(url: str, notes: list[str], include_retired: bool) -> _PostgresView:
    """Running tasks per worker, the fleet row, each worker's complete-report times and (with
    ``include_retired``) the retired workers; all ``None``, with a note, on failure."""
    from reaper.cli import read

    try:
        conn = await read.open_connection(url, timeout_s=5)
        try:
            running = await read.running_task_counts(conn)
            row = await read.fleet_state(conn)
            retired = await read.retired_workers(conn) if include_retired else None
            reports = await read.report_times(conn)
        finally:
            await conn.close()
    except Exception as exc:
        notes.append(f"Postgres: {_first_line(exc)}")
        return _PostgresView()
    fleet = None if row is None else {"state": row.state, "since": row.since.isoformat()}
    return _PostgresView(running, fleet, retired, reports)


def _retired_row(
    w: read.RetiredWorker, running: dict[str, int] | None, now: datetime
) -> dict[str, Any]:
    """A retired worker's row, in the shape of a live one (nothing missing, nothing owed)."""
    last = w.last_heartbeat_at
    return {
        "worker": w.name,
        "state": "retired",
        "draining": False,
        "last_heartbeat_at": last.isoformat() if last else None,
        "age_s": round((now - last).total_seconds(), 1) if last else None,
        "missing": 0,
        "running_tasks": running.get(w.name, 0) if running is not None else None,
        "boot_id": w.boot_id,
        "last_seq": w.last_seq,
        "assignments": 0,
        "orphans": 0,
        "complete_reports": None,
        "liveness_only": None,
    }


async def fleet_overview(
    settings: ConnectionSettings,
    include_retired: bool = False,
    include_tasks: bool = False,
    resync_interval: float = DEFAULT_RESYNC_S,
) -> dict[str, Any]:
    """Every running liveness with its ``state``, running-task counts and the fleet state;
    with ``include_retired``, retired workers too (hidden otherwise); with
    ``include_tasks``, the pending and running tasks by worker
    (:mod:`reaper.cli.commands.worker_tasks`).

    Args:
        resync_interval: ``REAPER_RESYNC_INTERVAL``, seconds: how long a worker's beats may
            carry no complete report before it ``liveness_only`` (``policy.reports``).

    Returns:
        A JSON-ready dict ``{"fleet": {"state", "since"} | None, "workers": [...],
        "notes": [...]}`` and, with ``include_tasks``, ``"tasks": {worker: [...]} | None``;
        a worker whose query failed has ``{"worker", "error"}`` only. Each worker has
        ``complete_reports`` (kind -> its last complete report, ISO UTC, as its row holds
        it) and ``liveness_only`` (``{"since", "kinds"}`` or ``None``).

    Raises:
        CliError: Temporal is unreachable.
    """
    client = await connect_temporal(settings)
    query = f"WorkflowType='{LIVENESS_WORKFLOW}' AND ExecutionStatus='Running'"
    with progress("listing liveness workflows…"):
        ids = sorted([wf.id async for wf in client.list_workflows(query)])
    sem = asyncio.Semaphore(QUERY_CONCURRENCY)
    answered = 0

    async def one(wf_id: str, show: Callable[[str], None]) -> tuple[str, StateView | str]:
        nonlocal answered
        async with sem:
            try:
                view = await query_state(client.get_workflow_handle(wf_id), QUERY_TIMEOUT_S)
                return wf_id, view
            except TimeoutError:
                return wf_id, f"query failed: no answer in {QUERY_TIMEOUT_S:g} s (busy)"
            except Exception as exc:
                return wf_id, f"query failed: {_first_line(exc)}"
            finally:
                answered += 1
                show(f"querying the state of {len(ids)} workers… {answered} answered")

    with progress(f"querying the state of {len(ids)} workers…") as show:
        results = await asyncio.gather(*(one(i, show) for i in ids))
    notes: list[str] = []
    pg = _PostgresView()
    url = find_database_url(settings)
    if url is None:
        notes.append("Postgres not reachable (embedded server not running): task counts unknown")
    else:
        pg = await _postgres_view(url, notes, include_retired)
    running, fleet, retired = pg.running, pg.fleet, pg.retired
    if include_retired and retired is None:
        notes.append("retired workers unknown (they are listed from Postgres)")
    tasks = None
    if include_tasks and url is not None:
        from reaper.cli.commands.worker_tasks import tasks_by_worker

        tasks = await tasks_by_worker(url, notes)
    now = datetime.now(UTC)
    workers: list[dict[str, Any]] = []
    for wf_id, view in results:
        if isinstance(view, str):
            workers.append({"worker": wf_id.removeprefix("liveness-"), "error": view})
            continue
        if view.state == "retired" and not include_retired:
            continue  # retired a moment ago; its liveness is about to complete
        last = view.last_heartbeat_at
        row = pg.reports.get(view.worker) if pg.reports is not None else None
        # Drained as soon as either says so: Postgres holds it first (`drain --wait` and
        # `explain` read it there), the liveness a signal later.
        drained = view.draining and (
            view.drained or (row is not None and row.drained_at is not None)
        )
        workers.append(
            {
                "worker": view.worker,
                "state": view.state,
                "draining": view.draining,
                "drained": drained,
                "last_heartbeat_at": last.isoformat() if last else None,
                "age_s": round((now - last).total_seconds(), 1) if last else None,
                "missing": view.missing,
                "running_tasks": running.get(view.worker, 0) if running is not None else None,
                "boot_id": view.boot_id,
                "last_seq": view.last_seq,
                "assignments": len(view.assignments),
                "orphans": len(view.orphans),
                **report_fields(row, resync_interval),
            }
        )
    if retired:
        # A running liveness is the newer truth (a retired name that registered afresh).
        listed = {w["worker"] for w in workers}
        workers += [_retired_row(w, running, now) for w in retired if w.name not in listed]
        workers.sort(key=lambda w: str(w["worker"]))
    overview: dict[str, Any] = {"fleet": fleet, "workers": workers, "notes": notes}
    if include_tasks:
        overview["tasks"] = tasks
    return overview


@app.command(short_help="The fleet: one row per worker, with its state and counts.")
def workers(
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    show_all: bool = typer.Option(
        False, "--all", help="Also list retired workers (out of the fleet, hidden by default)."
    ),
    show_tasks: bool = typer.Option(
        False,
        "--tasks",
        help="Also list which task runs where: every pending or running task under its "
        "worker, with its service and state (from Postgres).",
    ),
    address: str | None = ADDRESS_OPTION,
    namespace: str | None = NAMESPACE_OPTION,
    database_url: str | None = DATABASE_URL_OPTION,
    state_dir: str | None = STATE_DIR_OPTION,
) -> None:
    """The fleet: each worker's state, how long ago its last heartbeat (heartbeat) and its
    last complete report (report) came, its missing handles, orphans and running tasks
    (tasks), under the fleet's disruption state. A worker whose beats have carried no
    complete report for longer than RESYNC_INTERVAL is "(liveness only)". Retired workers
    are listed only with --all; --tasks lists each worker's tasks."""
    try:
        settings = connection_settings_from(
            temporal_address=address,
            namespace=namespace,
            database_url=database_url,
            state_dir=state_dir,
        )
        resync, note = resync_interval_of()
        overview = asyncio.run(
            fleet_overview(
                settings,
                include_retired=show_all,
                include_tasks=show_tasks,
                resync_interval=resync,
            )
        )
        overview["notes"] += [note] if note else []
    except CliError as exc:
        fail(exc)
    except Exception as exc:
        fail(CliError(f"workers: {exc}"))
    if as_json:
        print(json.dumps(overview, indent=2))
        exit_now(0)
    print_overview(overview)
    exit_now(0)
