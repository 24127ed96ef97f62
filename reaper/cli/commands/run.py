"""``reaper run``: the controller on the embedded stack until Ctrl-C or SIGTERM."""

from __future__ import annotations

import logging
import signal
import time
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from reaper.cli.app import (
    ADDRESS_OPTION,
    NAMESPACE_OPTION,
    TASK_QUEUE_OPTION,
    CliError,
    app,
    console,
    err,
    fail,
    settings_from,
)
from reaper.logs import setup_logging

if TYPE_CHECKING:
    from reaper.cli.stack import Stack

CHECK_EVERY_S = 0.5
"""How often the supervisor looks for a dead child, in seconds."""


class _Stop(BaseException):
    """SIGTERM or SIGHUP: leave the main loop and stop the stack."""


@app.command(short_help="Run the controller on the embedded stack until Ctrl-C.")
def run(
    temporal_address: str | None = ADDRESS_OPTION,
    namespace: str | None = NAMESPACE_OPTION,
    task_queue: str | None = TASK_QUEUE_OPTION,
    database_url: str | None = typer.Option(
        None,
        metavar="URL",
        help="The postgresql:// URL of reaper's database (env REAPER_DATABASE_URL; default an "
        "embedded Postgres under --state-dir).",
    ),
    heartbeat_interval: str | None = typer.Option(
        None,
        metavar="DURATION",
        help="How often agents beat (env REAPER_HEARTBEAT_INTERVAL; default 10s).",
    ),
    stall_after: str | None = typer.Option(
        None,
        metavar="DURATION",
        help="Silence after which a worker is stalled (env REAPER_STALL_AFTER; default 30s).",
    ),
    lost_after: str | None = typer.Option(
        None,
        metavar="DURATION",
        help="Silence after which a worker is lost and reaped (env REAPER_LOST_AFTER; default 5m).",
    ),
    missing_ttl: str | None = typer.Option(
        None,
        metavar="DURATION",
        help="How long a handle is missing before it is destroyed, or unknown before it is an "
        "orphan (env REAPER_MISSING_TTL; default 5m).",
    ),
    creating_timeout: str | None = typer.Option(
        None,
        metavar="DURATION",
        help="How long a row may stay creating (env REAPER_CREATING_TIMEOUT; default 1h).",
    ),
    disruption_threshold: float | None = typer.Option(
        None,
        metavar="FRACTION",
        help="The unhealthy fraction in (0, 1] at which automatic reaping stops "
        "(env REAPER_DISRUPTION_THRESHOLD; default 0.55).",
    ),
    resync_interval: str | None = typer.Option(
        None,
        metavar="DURATION",
        help="A scheduler's change to a worker's rows is diffed within this plus two heartbeat "
        "intervals (CONTRACT.md §5.3; env REAPER_RESYNC_INTERVAL; default 30s).",
    ),
    dry_run: bool | None = typer.Option(
        None,
        "--dry-run/--no-dry-run",
        help="Decide but change nothing: write would-* events only (env REAPER_DRY_RUN).",
    ),
    state_dir: str | None = typer.Option(
        None,
        metavar="DIR",
        help="Where Temporal's file, Postgres' data and the logs live (env REAPER_STATE_DIR; "
        "default .reaper).",
    ),
    ui_port: int | None = typer.Option(
        None,
        metavar="PORT",
        help="The port of the Temporal Web UI (env REAPER_UI_PORT; default 8233).",
    ),
    controllers: int | None = typer.Option(
        None,
        metavar="N",
        help="How many controller processes to run on the task queue, each restarted when it "
        "dies (env REAPER_CONTROLLERS; default one per two cores).",
    ),
) -> None:
    """Run the controller on the embedded stack (Temporal dev server with its Web UI, and
    Postgres) until Ctrl-C or SIGTERM, then stop everything. Durations are seconds (30) or
    strings such as 30s, 5m or 1h30m."""
    from reaper.cli.stack import Stack, StackError
    from reaper.core.policy.rollout import RELEASE_LINES

    try:
        settings = settings_from(
            temporal_address=temporal_address,
            namespace=namespace,
            task_queue=task_queue,
            database_url=database_url,
            heartbeat_interval=heartbeat_interval,
            stall_after=stall_after,
            lost_after=lost_after,
            missing_ttl=missing_ttl,
            creating_timeout=creating_timeout,
            disruption_threshold=disruption_threshold,
            resync_interval=resync_interval,
            dry_run=dry_run,
            state_dir=state_dir,
            ui_port=ui_port,
            controllers=controllers,
        )
    except CliError as exc:
        fail(exc)
    if "peer_version" not in settings.model_fields_set:
        # One controller and no older peer: this release's own line (rollout.py), so the
        # embedded stack has all of it (migrating drains, operator updates) unless told.
        settings = settings.model_copy(update={"peer_version": RELEASE_LINES[-1]})
    setup_logging(logging.WARNING)

    def on_signal(signum: int, _frame: object) -> None:
        raise _Stop()

    signal.signal(signal.SIGINT, on_signal)  # also when started with SIGINT ignored (nohup, &)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    stack = Stack(settings)
    code = 0
    try:
        stack.start(on_progress=lambda m: console.print(f"[dim]•[/] {m}", highlight=False))
        print_stack(stack)
        while True:
            time.sleep(CHECK_EVERY_S)
            for message in stack.check():
                console.print(f"[yellow]![/] {message}", highlight=False)
    except (KeyboardInterrupt, _Stop):
        console.print("\nstopping…")
    except StackError as exc:
        err.print(f"[bold red]reaper:[/] {exc}", highlight=False)
        code = 1
    except Exception as exc:  # anything unexpected: still stop what was started
        err.print(f"[bold red]reaper:[/] {type(exc).__name__}: {exc}", highlight=False)
        code = 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        stack.stop()
    if code == 0:
        console.print(
            f"stopped: controller, Temporal and Postgres are down; state kept in {stack.state_dir}"
        )
    raise typer.Exit(code)


def print_stack(stack: Stack) -> None:
    """Where each piece of a started stack is (Web UI, Temporal, Postgres, controller)."""
    s = stack.settings
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")  # a long path folds, never cut short
    if stack.ui_url:
        table.add_row("Temporal Web UI", f"[bold]{stack.ui_url}[/]")
    table.add_row("Temporal", f"{stack.temporal_address} (namespace {s.namespace})")
    table.add_row(
        "Postgres",
        "embedded, " + str(stack.postgres.pgdata) if stack.postgres else "REAPER_DATABASE_URL",
    )
    pids = ", ".join(str(c.pid) for c in stack.controllers)
    if len(stack.controllers) > 1:
        table.add_row("Controllers", f"{len(stack.controllers)}, pids {pids}")
        table.add_row("", f"task queue {s.task_queue!r}, logs in {stack.state_dir / 'logs'}")
    else:
        table.add_row("Controller", f"pid {pids}, task queue {s.task_queue!r}")
    # Two rows, each under 80 columns with the widest label: one row wrapped mid-phrase.
    table.add_row(
        "Timings",
        f"heartbeat {s.heartbeat_interval:g}s, stalled after {s.stall_after:g}s, "
        f"lost after {s.lost_after:g}s",
    )
    table.add_row(
        "",
        f"missing TTL {s.missing_ttl:g}s, resync {s.resync_interval:g}s"
        + (", DRY RUN" if s.dry_run else ""),
    )
    table.add_row("State", str(stack.state_dir))
    console.print(table)
    console.print("reaper is running; Ctrl-C to stop.")
