"""``reaper reset``: start afresh, by deleting the embedded stack's state (``make run``'s
``.reaper/``: Temporal's SQLite file, Postgres' data, the logs).

What ``reaper run`` keeps across restarts is every worker, task, row and event of the
README's "Try it" sections; the next section, or a second try, starts cleanly only without
them. Deleting the directory is all a reset is, but done by hand it is easy to do while the
stack still runs (Postgres and Temporal then go on writing into a deleted directory) or to
point at the wrong directory, so the command refuses both:

- while anything runs on the directory: its embedded Postgres (its ``postmaster.pid``
  names a live process), or a Temporal dev server started with its ``temporal.db`` (a
  process whose command line names that file; read from ``/proc`` where there is one);
- when the directory holds anything that is not the stack's (:data:`STACK_ENTRIES`, and
  ``*.log``): a ``--state-dir`` given by mistake is never emptied.

It never touches a database named by ``REAPER_DATABASE_URL`` (that one is yours: the reset
says so), nor ``.env`` or the agents' state directories.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import typer

from reaper.cli.app import (
    STATE_DIR_OPTION,
    CliError,
    app,
    connection_settings_from,
    console,
    exit_now,
    fail,
)

STACK_ENTRIES = frozenset(
    {
        "postgres",
        "temporal.db",
        "temporal.db-shm",
        "temporal.db-wal",
        "temporal.db-journal",
        "artifacts",
    }
)
"""What ``reaper run`` (and the test suite's artifacts, under the default ``.reaper/``) keep in
the state directory, besides ``*.log`` files."""


def strangers(state: Path) -> list[str]:
    """The entries of ``state`` that are not the stack's, sorted."""
    return sorted(
        p.name for p in state.iterdir() if p.name not in STACK_ENTRIES and p.suffix != ".log"
    )


def users_of(db_file: Path) -> list[int]:
    """Pids of processes whose command line names ``db_file`` (a Temporal dev server started
    with ``--db-filename`` it), read from ``/proc``; empty where there is none."""
    proc, found, wanted = Path("/proc"), [], str(db_file).encode()
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if wanted in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return sorted(found)


def check_stopped(state: Path) -> None:
    """Refuse while anything runs on ``state``.

    Raises:
        CliError: its Postgres or a Temporal dev server on its ``temporal.db`` runs.
    """
    from reaper.kit.postgres import EmbeddedPostgres

    why = []
    pgdata = state / "postgres"
    if pgdata.is_dir() and EmbeddedPostgres(pgdata).running():
        why.append("its Postgres is running")
    pids = users_of(state / "temporal.db")
    if pids:
        why.append(f"a Temporal dev server uses its temporal.db (pid {', '.join(map(str, pids))})")
    if why:
        raise CliError(
            f"reset: `reaper run` is still running on {state} ({'; '.join(why)}): stop it first"
            " (Ctrl-C in its terminal), then reset"
        )


@app.command(short_help="Start afresh: delete the embedded stack's state (.reaper/).")
def reset(
    yes: bool = typer.Option(
        False, "--yes", "-y", help="Delete without asking (needed when not on a terminal)."
    ),
    state_dir: str | None = STATE_DIR_OPTION,
) -> None:
    """Delete the embedded stack's state directory (.reaper/ by default: Temporal's SQLite
    file, Postgres' data, the logs), so that the next `reaper run` (make run) starts with no
    worker, task, row or event: between the README's two "Try it" sections, or to try again.
    Refused while `reaper run` runs on it, or when it holds files that are not the stack's. A
    database named by REAPER_DATABASE_URL is never touched."""
    try:
        settings = connection_settings_from(state_dir=state_dir)
        state = Path(settings.state_dir).resolve()
        if not state.exists():
            console.print(f"nothing to reset: {state} does not exist", highlight=False)
            exit_now(0)
        if not state.is_dir():
            raise CliError(f"reset: {state} is not a directory")
        others = strangers(state)
        if others:
            raise CliError(
                f"reset: {state} holds files that are not reaper's ({', '.join(others[:5])}):"
                " nothing deleted; check --state-dir (REAPER_STATE_DIR)"
            )
        check_stopped(state)
        if not yes:
            if not sys.stdin.isatty():
                raise CliError("reset: give --yes to delete without asking", code=2)
            if not typer.confirm(
                f"Delete {state} (every worker, task, row and event of the embedded stack)?"
            ):
                console.print("nothing deleted")
                exit_now(1)
        shutil.rmtree(state)
    except CliError as exc:
        fail(exc)
    except OSError as exc:
        fail(CliError(f"reset: {exc}"))
    console.print(
        f"deleted {state}: the next `reaper run` (make run) starts an empty stack",
        highlight=False,
    )
    if settings.database_url:
        console.print(
            "note: REAPER_DATABASE_URL's database was not touched (reset deletes the embedded"
            " stack's state only)",
            highlight=False,
        )
    exit_now(0)
