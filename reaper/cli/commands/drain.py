"""``reaper drain``, ``undrain``, ``retire`` and ``force-reap``: an operator's command to one
worker's liveness, and its answer (CONTRACT.md §6.3).

Each is sent as the Temporal Update of its name: the liveness's validator refuses what it
would not take (malformed, unauthenticated in ``required`` mode, a worker unknown or
retired, a drain's bad deadline) with a one-line reason, which the command prints before
exiting 1 (nothing changed, no event in the workflow's history); an accepted one answers
with what changed, which the command prints. A liveness of the 1.1 line (peer version 1.1,
or a 1.1.0 controller) has no updates: the command then sends the signal as 1.1 did and
reads the liveness's ``state`` before and after to tell a rejection.

The payload is ``{"reason": ..., "actor": ...}`` (§2, §5.1), the actor ``$USER``, or
``operator`` when ``$USER`` is unset or empty; ``drain --migrate [--deadline D]`` adds
``migrate`` and ``deadline`` (§6.1), and ``--wait`` follows the migration in Postgres, a
line per task as its replacement is placed, runs and its original stops, until the worker
is drained and its agent reports no task left on its host (exit 0; 1 if the deadline
stopped a task whose replacement was not running, or an undrain ended the drain).

With ``--key-file FILE`` (env ``REAPER_OPERATOR_KEY_FILE``) the command is signed for the
worker with that Ed25519 key, ``signed_at`` from this host's clock (§5.2), so it acts in
``REAPER_AGENT_AUTH=required`` mode when the key's public half is in the controllers'
``REAPER_OPERATOR_KEYS``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from reaper.cli.app import (
    ADDRESS_OPTION,
    DATABASE_URL_OPTION,
    NAMESPACE_OPTION,
    STATE_DIR_OPTION,
    CliError,
    PlainArgumentsCommand,
    app,
    connection_settings_from,
    console,
    err,
    exit_now,
    fail,
)
from reaper.cli.commands.drain_wait import follow_drain
from reaper.cli.operator import CONFIRM_TIMEOUT_S, Sent, command_worker, describe_answer
from reaper.core.config_values import parse_duration
from reaper.core.contract import (
    DRAIN_SIGNAL,
    FORCE_REAP_SIGNAL,
    RETIRE_SIGNAL,
    UNDRAIN_SIGNAL,
)

if TYPE_CHECKING:
    pass

REASON_OPTION: Any = typer.Option(
    ...,
    "--reason",
    metavar="TEXT",
    help="Why, recorded in the events rows with the actor: $USER, or operator if $USER is "
    "unset or empty.",
)
KEY_FILE_OPTION: Any = typer.Option(
    None,
    "--key-file",
    envvar="REAPER_OPERATOR_KEY_FILE",
    show_envvar=False,
    metavar="FILE",
    help="Sign the signal with this Ed25519 private key (reaper keygen), as "
    "REAPER_AGENT_AUTH=required needs; its public key must be in the controllers' "
    "REAPER_OPERATOR_KEYS (env REAPER_OPERATOR_KEY_FILE; default unsigned).",
)


def _operator_command(
    name: str,
    worker: str,
    reason: str,
    address: str | None,
    namespace: str | None,
    key_file: Path | None,
    extra: dict[str, Any] | None = None,
) -> Sent:
    """Send the command and print what it did; exits 1 (with the reason) on a refusal."""
    from reaper.cli.keys import loose_mode, read_key
    from reaper.core.signing import public_key_text

    try:
        settings = connection_settings_from(temporal_address=address, namespace=namespace)
        key = read_key(key_file.expanduser(), "--key-file") if key_file is not None else None
        if key_file is not None and (warning := loose_mode(key_file.expanduser())):
            err.print(f"reaper: warning: {warning}", highlight=False, markup=False)
        sent = asyncio.run(command_worker(settings, worker, name, reason, key, extra))
    except CliError as exc:
        fail(exc)
    except Exception as exc:
        fail(CliError(f"{name}: {exc}"))
    signed = f", signed by {public_key_text(key)}" if key is not None else ""
    if sent.answer is not None:
        said = f" (reason: {reason!r}, actor: {sent.actor}{signed})"
        console.print(
            describe_answer(name, worker, sent.answer) + said, highlight=False, markup=False
        )
        return sent
    console.print(
        f"sent {name} to liveness-{worker} (reason: {reason!r}, actor: {sent.actor}{signed});"
        " its controller takes no updates (the 1.1 line): no answer",
        highlight=False,
        markup=False,
    )
    if not sent.confirmed:
        err.print(
            f"reaper: not confirmed: no controller answered liveness-{worker}'s state query "
            f"within {CONFIRM_TIMEOUT_S:g}s; the signal waits in Temporal for one",
            highlight=False,
            markup=False,
        )
    return sent


@app.command(
    "force-reap", short_help="Reap WORKER now and replace its tasks.", cls=PlainArgumentsCommand
)
def force_reap(
    worker: str = typer.Argument(..., metavar="WORKER", help="The worker's name."),
    reason: str = REASON_OPTION,
    key_file: Path | None = KEY_FILE_OPTION,
    address: str | None = ADDRESS_OPTION,
    namespace: str | None = NAMESPACE_OPTION,
) -> None:
    """Reap WORKER now: its tasks become lost and are replaced elsewhere."""
    _operator_command(FORCE_REAP_SIGNAL, worker, reason, address, namespace, key_file)
    exit_now(0)


@app.command(
    short_help="Place nothing new on WORKER; --migrate moves its tasks off.",
    cls=PlainArgumentsCommand,
)
def drain(
    worker: str = typer.Argument(..., metavar="WORKER", help="The worker's name."),
    reason: str = REASON_OPTION,
    migrate: bool = typer.Option(
        False,
        "--migrate",
        help="Move its tasks, replacement first: each task's replacement is placed elsewhere "
        "and the task stops once that runs, at most the service's max_surge at a time.",
    ),
    deadline: str | None = typer.Option(
        None,
        "--deadline",
        metavar="D",
        help="With --migrate: what is still on WORKER after D (30m, 1h) is stopped and "
        "backfilled (default REAPER_DRAIN_DEADLINE of the controllers, 1h).",
    ),
    wait: bool = typer.Option(
        False,
        "--wait",
        help="Show each task's migration as it happens and exit once WORKER is drained and "
        "its agent reports no task left on its host (1 if the deadline stopped a task whose "
        "replacement did not run).",
    ),
    key_file: Path | None = KEY_FILE_OPTION,
    address: str | None = ADDRESS_OPTION,
    namespace: str | None = NAMESPACE_OPTION,
    database_url: str | None = DATABASE_URL_OPTION,
    state_dir: str | None = STATE_DIR_OPTION,
) -> None:
    """Drain WORKER: nothing new is placed on it. With --migrate its tasks are moved off,
    replacement first; --wait follows them until WORKER is drained (holds no task) and its
    agent has stopped the last of them, which is when its host may be terminated (then
    reaper retire WORKER)."""
    extra: dict[str, Any] = {}
    if deadline is not None and not migrate:
        fail(CliError("--deadline needs --migrate", code=2))
    if migrate:
        extra["migrate"] = True
    if deadline is not None:
        try:
            extra["deadline"] = parse_duration(deadline)
        except ValueError as exc:
            fail(CliError(f"--deadline: {exc}", code=2))
    sent = _operator_command(DRAIN_SIGNAL, worker, reason, address, namespace, key_file, extra)
    if not wait:
        exit_now(0)
    try:
        settings = connection_settings_from(
            temporal_address=address,
            namespace=namespace,
            database_url=database_url,
            state_dir=state_dir,
        )
        code = asyncio.run(follow_drain(settings, worker, sent.answer))
    except CliError as exc:
        fail(exc)
    exit_now(code)


@app.command(short_help="Let placements on WORKER resume.", cls=PlainArgumentsCommand)
def undrain(
    worker: str = typer.Argument(..., metavar="WORKER", help="The worker's name."),
    reason: str = REASON_OPTION,
    key_file: Path | None = KEY_FILE_OPTION,
    address: str | None = ADDRESS_OPTION,
    namespace: str | None = NAMESPACE_OPTION,
) -> None:
    """Undrain WORKER: placements on it resume (owed work may be placed there); a migration
    ends: replacements not yet running are stopped, the tasks not yet moved stay."""
    _operator_command(UNDRAIN_SIGNAL, worker, reason, address, namespace, key_file)
    exit_now(0)


@app.command(short_help="Take WORKER out of the fleet for good.", cls=PlainArgumentsCommand)
def retire(
    worker: str = typer.Argument(..., metavar="WORKER", help="The worker's name."),
    reason: str = REASON_OPTION,
    key_file: Path | None = KEY_FILE_OPTION,
    address: str | None = ADDRESS_OPTION,
    namespace: str | None = NAMESPACE_OPTION,
) -> None:
    """Retire WORKER for good (scale-in, decommission): its tasks are replaced elsewhere now,
    its container and volume rows deleted, and it leaves the fleet."""
    _operator_command(RETIRE_SIGNAL, worker, reason, address, namespace, key_file)
    exit_now(0)
