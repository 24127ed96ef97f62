"""``reaper try-scheduler``: a stand-in for a real scheduler, to try reaper on ``make run``.

It writes what a scheduler would (CONTRACT.md §3) through :mod:`reaper.cli.read`: a service
with ``desired_count``, its tasks ``pending`` and placed round-robin on the running,
non-draining workers, and one container and one volume row per task. With ``--agents-dir``
it also creates those containers and volumes in the reference agents' state directories
(``DIR/WORKER/containers/...``), as a scheduler would tell its workers to; without it the
rows are missing on their workers and are destroyed after ``MISSING_TTL``. With
``--tasks-only`` it writes no container or volume rows: the ``docker`` runtime reports a
task's container and volumes as the task.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from reaper.cli.app import (
    DATABASE_URL_OPTION,
    STATE_DIR_OPTION,
    CliError,
    app,
    connection_settings_from,
    console,
    exit_now,
    fail,
)
from reaper.cli.commands.workers import find_database_url
from reaper.core import kinds


async def place_service(
    url: str, service: str, count: int, agents_dir: Path | None, tasks_only: bool = False
) -> list[tuple[str, str]]:
    """Write service ``service`` with ``count`` tasks, their containers and volumes (none
    with ``tasks_only``).

    Returns:
        ``(task id, worker)`` per task placed.

    Raises:
        CliError: Postgres unreachable, no running worker, or the service exists already.
    """
    import asyncpg

    from reaper.cli import read, scheduler

    try:
        conn = await read.open_connection(url, timeout_s=5)
    except Exception as exc:
        raise CliError(f"Postgres unreachable at {url.split('@')[-1]}: {exc}") from None
    try:
        if not await read.schema_ready(conn):
            raise CliError("no reaper schema in this database yet (has the controller started?)")
        workers = await read.running_workers(conn)
        if not workers:
            raise CliError("no running worker to place tasks on: start a `reaper agent` first")
        placed = [(f"{service}-{i + 1}", workers[i % len(workers)]) for i in range(count)]
        try:
            async with conn.transaction():
                await scheduler.add_service(conn, service, count)
                for task_id, worker in placed:
                    await scheduler.add_task(conn, task_id, service, worker)
                    if tasks_only:
                        continue
                    for kind in kinds.HANDLE_ROWS:
                        await scheduler.add_handle(
                            conn, kind.report, f"{task_id}-{kind.word[0]}", worker
                        )
        except asyncpg.UniqueViolationError:
            raise CliError(
                f"service {service!r} (or one of its tasks) exists already: pick another --service"
            ) from None
    finally:
        await conn.close()
    if agents_dir is not None and not tasks_only:
        for task_id, worker in placed:
            for kind in kinds.HANDLE_ROWS:
                folder = agents_dir / worker / kind.report
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{task_id}-{kind.word[0]}").touch()
    return placed


@app.command(
    "try-scheduler",
    short_help="A stand-in for a scheduler: places a sample service, to try reaper.",
)
def try_scheduler(
    service: str = typer.Option(
        "web", "--service", metavar="NAME", help="The service's name (it must not exist yet)."
    ),
    count: int = typer.Option(
        2, "--count", metavar="N", help="The service's desired_count: how many tasks to place."
    ),
    agents_dir: Path | None = typer.Option(
        None,
        "--agents-dir",
        metavar="DIR",
        help="Also create each container and volume in DIR/WORKER/, the state directories "
        "of reference agents started with --state-dir DIR/WORKER.",
    ),
    tasks_only: bool = typer.Option(
        False,
        "--tasks-only",
        help="Write the service and its tasks only, no container or volume rows: for agents "
        "that report a task's objects as the task (reaper agent --runtime docker).",
    ),
    database_url: str | None = DATABASE_URL_OPTION,
    state_dir: str | None = STATE_DIR_OPTION,
) -> None:
    """A stand-in for a real scheduler, for trying reaper out (not for production): it writes
    a service with desired_count N, N pending tasks placed round-robin on the running,
    non-draining workers, and one container and one volume row per task, as a scheduler
    would (CONTRACT.md section 3). The agents start their tasks at their next beats."""
    try:
        if count < 1:
            raise CliError("--count must be at least 1", code=2)
        settings = connection_settings_from(database_url=database_url, state_dir=state_dir)
        url = find_database_url(settings)
        if url is None:
            raise CliError(
                f"Postgres not found: the embedded one is not running under {settings.state_dir}"
                " (is `reaper run` running? otherwise set REAPER_DATABASE_URL or --database-url)"
            )
        placed = asyncio.run(place_service(url, service, count, agents_dir, tasks_only))
    except CliError as exc:
        fail(exc)
    except Exception as exc:
        fail(CliError(f"try-scheduler: {str(exc).splitlines()[0] if str(exc) else repr(exc)}"))
    console.print(f"service {service} (desired_count {count}), as a scheduler would place it:")
    for task_id, worker in placed:
        objects = "" if tasks_only else f", container {task_id}-c, volume {task_id}-v"
        console.print(f"  task {task_id} on {worker}{objects}", highlight=False)
    exit_now(0)
