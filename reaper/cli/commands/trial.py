"""``reaper try-scheduler``: a stand-in for a real scheduler, to try reaper on ``make run``.

It writes what a scheduler would (CONTRACT.md §3) through :mod:`reaper.cli.read`: a service
with ``desired_count``, its tasks ``pending`` and placed round-robin on the running,
non-draining workers, and one container and one volume row per task. With ``--agents-dir``
it also creates those containers and volumes in the reference agents' state directories
(``DIR/WORKER/containers/...``), as a scheduler would tell its workers to; without it the
rows are missing on their workers and are destroyed once missing as long as their kind waits
(``policy.collection.destroy_after``). With ``--tasks-only`` it writes no container or volume
rows: the ``docker`` runtime reports a task's container and volumes as the task.

It can run again: a service that exists is brought to ``--count`` (its ``desired_count``
set, only the tasks its active ones fall short of placed), as applying a scheduler's
service again does; it never stops a task (reaper stops those their workers do not hold,
rule 4). ``reaper reset`` starts from scratch.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import NamedTuple

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


class Placement(NamedTuple):
    """What :func:`place_service` did.

    Attributes:
        placed: ``(task id, worker)`` per task placed now.
        existed: the service was there already (a second run).
        desired_before: its ``desired_count`` before (``None`` when it is new).
        active_before: its active tasks before (pending, owed or running).
    """

    placed: list[tuple[str, str]]
    existed: bool = False
    desired_before: int | None = None
    active_before: tuple[str, ...] = ()


def next_ids(service: str, taken: set[str], count: int) -> list[str]:
    """``count`` task ids ``<service>-<n>`` not in ``taken``, smallest ``n`` first."""
    out: list[str] = []
    n = 0
    while len(out) < count:
        n += 1
        if f"{service}-{n}" not in taken:
            out.append(f"{service}-{n}")
    return out


async def place_service(
    url: str, service: str, count: int, agents_dir: Path | None, tasks_only: bool = False
) -> Placement:
    """Bring service ``service`` to ``count`` tasks, as a scheduler applying it would: a new
    service gets ``count`` tasks (``<service>-1`` ...), their containers and volumes (none
    with ``tasks_only``); one that exists gets ``desired_count`` ``count`` and as many new
    tasks (with ids not taken yet) as its active ones fall short, so that running it again
    places nothing more. Never more active tasks than ``count`` (CONTRACT.md §5.1); nothing
    is stopped (that is reaper's, rule 4, or a real scheduler's).

    Raises:
        CliError: Postgres unreachable, no running worker for tasks to place, or a
            container or volume row of a new task's name exists already.
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
        try:
            async with conn.transaction():
                before = await read.service_state(conn, service, lock=True)
                if before is None:
                    await scheduler.add_service(conn, service, count)
                    taken: set[str] = set()
                    active: list[str] = []
                else:
                    taken, active = before.numbered, before.active
                    if before.desired_count != count:
                        await scheduler.set_desired_count(conn, service, count)
                ids = next_ids(service, taken, max(0, count - len(active)))
                if ids and not workers:
                    raise CliError(
                        "no running worker to place tasks on: start a `reaper agent` first"
                    )
                placed = [(task_id, workers[i % len(workers)]) for i, task_id in enumerate(ids)]
                for task_id, worker in placed:
                    await scheduler.add_task(conn, task_id, service, worker)
                    if tasks_only:
                        continue
                    for kind in kinds.HANDLE_ROWS:
                        await scheduler.add_handle(
                            conn, kind.report, f"{task_id}-{kind.word[0]}", worker
                        )
        except asyncpg.UniqueViolationError as exc:
            raise CliError(
                f"a task, container or volume named like service {service!r}'s exists already"
                f" ({exc.detail or exc}): pick another --service"
            ) from None
    finally:
        await conn.close()
    if agents_dir is not None and not tasks_only:
        for task_id, worker in placed:
            for kind in kinds.HANDLE_ROWS:
                folder = agents_dir / worker / kind.report
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{task_id}-{kind.word[0]}").touch()
    if before is None:
        return Placement(placed)
    return Placement(placed, True, before.desired_count, tuple(before.active))


@app.command(
    "try-scheduler",
    short_help="A stand-in for a scheduler: places a sample service, to try reaper.",
)
def try_scheduler(
    service: str = typer.Option(
        "web",
        "--service",
        metavar="NAME",
        help="The service's name; if it exists, it is brought to --count tasks (placing only "
        "what its active tasks fall short of).",
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
        placement = asyncio.run(place_service(url, service, count, agents_dir, tasks_only))
    except CliError as exc:
        fail(exc)
    except Exception as exc:
        fail(CliError(f"try-scheduler: {str(exc).splitlines()[0] if str(exc) else repr(exc)}"))
    print_placement(service, count, placement, tasks_only)
    exit_now(0)


def print_placement(service: str, count: int, p: Placement, tasks_only: bool) -> None:
    """What :func:`place_service` did, in a few lines."""
    if not p.existed:
        console.print(f"service {service} (desired_count {count}), as a scheduler would place it:")
    else:
        was = f"desired_count {p.desired_before}, {len(p.active_before)} active tasks"
        now = "" if p.desired_before == count else f"; desired_count now {count}"
        more = f"placed {len(p.placed)} more:" if p.placed else "nothing to place"
        console.print(f"service {service} exists already ({was}){now}: {more}", highlight=False)
        if not p.placed:
            console.print(
                "  reaper stops and replaces those of its tasks that their workers do not hold"
                " (MISSING_TTL after); to start from scratch, stop `make run` and run"
                " `reaper reset`",
                highlight=False,
            )
    for task_id, worker in p.placed:
        objects = "".join(
            f", {k.word} {task_id}-{k.word[0]}" for k in ([] if tasks_only else kinds.HANDLE_ROWS)
        )
        console.print(f"  task {task_id} on {worker}{objects}", highlight=False)
