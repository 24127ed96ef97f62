"""The ``reaper`` typer app and what every command shares: options, errors, exit, logging.

Each command lives in :mod:`reaper.cli.commands` and registers itself on :data:`app`.
Commands import their heavy machinery (Temporal SDK, the stack, the demo) inside the
function, so that ``reaper --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import typer
from rich.console import Console
from typer import _click as click
from typer.core import TyperCommand

from reaper.core.config import (
    ConfigError,
    ConnectionSettings,
    Settings,
    load_connection_settings,
    load_settings,
)

app = typer.Typer(
    name="reaper",
    help="Durable liveness and garbage collection for cluster orchestrators (Temporal + Postgres).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: sentences rewrapped to the terminal, no type metavars such as <bool>, no
    # truncated option names (rich's option tables cut them at 80 columns).
    rich_markup_mode=None,
)


class PlainArgumentsCommand(TyperCommand):
    """A command whose positional arguments read as click writes them: ``WORKER`` in the
    usage line and in the Arguments section, where typer 0.29 writes ``{WORKER}`` and
    ``WORKER <str>`` (its markers of a required argument and of the argument's type). Give
    it to every command that takes arguments: ``@app.command(cls=PlainArgumentsCommand)``."""

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        """The usage pieces, a required argument unbraced, a hidden one left out."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if not getattr(param, "hidden", False):
                pieces.extend(param.get_usage_pieces(ctx))
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in pieces]

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The Arguments and Options sections, arguments without their ``<type>``."""
        args, opts = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                args.append((record[0].split(" <", 1)[0], record[1]))
            elif param.param_type_name == "option":
                opts.append(record)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        if opts:
            with formatter.section("Options"):
                formatter.write_dl(opts)


console = Console(soft_wrap=True)
"""Standard output of every command."""
err = Console(stderr=True, soft_wrap=True)
"""Standard error: failures and notes."""

CLI_CONNECT_DEADLINE_S = 10.0
"""Operator commands give up on an unreachable Temporal after this long (seconds)."""

ADDRESS_OPTION: Any = typer.Option(
    None,
    "--address",
    "--temporal-address",
    metavar="HOST:PORT",
    help="The Temporal frontend (env REAPER_TEMPORAL_ADDRESS; default 127.0.0.1:7233).",
)
NAMESPACE_OPTION: Any = typer.Option(
    None,
    "--namespace",
    metavar="NAME",
    help="The Temporal namespace (env REAPER_NAMESPACE; default default).",
)
TASK_QUEUE_OPTION: Any = typer.Option(
    None,
    "--task-queue",
    metavar="NAME",
    help="The controller's task queue (env REAPER_TASK_QUEUE; default reaper).",
)
DATABASE_URL_OPTION: Any = typer.Option(
    None,
    "--database-url",
    metavar="URL",
    help="The postgresql:// URL of reaper's database (env REAPER_DATABASE_URL; default the "
    "embedded Postgres of `reaper run`).",
)
STATE_DIR_OPTION: Any = typer.Option(
    None,
    "--state-dir",
    metavar="DIR",
    help="Where `reaper run` keeps the embedded Postgres (env REAPER_STATE_DIR; default .reaper).",
)


def _print_version(value: bool) -> None:
    if value:
        from reaper import __version__

        console.print(f"reaper {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print reaper's version (a release of CHANGELOG.md) and exit.",
    ),
) -> None:
    """Durable liveness and garbage collection for cluster orchestrators (Temporal + Postgres)."""


class CliError(Exception):
    """A failure to report in one line, with an exit status (1 failure, 2 bad configuration)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def settings_from(**overrides: Any) -> Settings:
    """Settings from ``REAPER_*`` variables and ``.env``, with the flags given (``None`` =
    not given) on top; keys are :class:`Settings` fields, each given by the flag
    ``--<field-with-dashes>``.

    Raises:
        CliError: exit status 2, the configuration is invalid; the message names the flag
            when a flag gave the value (:func:`name_flags`), the variable otherwise.
    """
    try:
        return load_settings(**overrides)
    except ConfigError as exc:
        raise CliError(f"bad configuration: {name_flags(str(exc), overrides)}", code=2) from None


def connection_settings_from(**overrides: Any) -> ConnectionSettings:
    """:func:`settings_from` for commands that only read or signal: where Temporal and
    Postgres are, and no controller timing (an out-of-range one must not stop them).

    Raises:
        CliError: exit status 2, the configuration is invalid.
    """
    try:
        return load_connection_settings(**overrides)
    except ConfigError as exc:
        raise CliError(f"bad configuration: {name_flags(str(exc), overrides)}", code=2) from None


def name_flags(message: str, overrides: dict[str, Any]) -> str:
    """``message`` with each ``REAPER_<FIELD>`` that a flag gave (a non-``None`` value in
    ``overrides``) named as that flag, ``--<field-with-dashes>``: a bad ``--lost-after 5x``
    is reported as ``--lost-after``, not as the variable the user never set."""
    for field, value in overrides.items():
        if value is not None:
            message = re.sub(
                rf"\bREAPER_{field.upper()}\b", "--" + field.replace("_", "-"), message
            )
    return message


def fail(exc: CliError) -> NoReturn:
    """Print ``reaper: <message>`` on standard error and exit with ``exc.code``."""
    err.print(f"[bold red]reaper:[/] {exc}", highlight=False, soft_wrap=True)
    exit_now(exc.code)


def exit_now(code: int) -> NoReturn:
    """Leave now, skipping interpreter teardown: the Temporal SDK can abort there after all
    work is done (docs/platform-notes.md, exit 134), which would turn a success into a failure."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@contextlib.contextmanager
def progress(message: str) -> Iterator[Callable[[str], None]]:
    """Show ``message`` with a spinner on standard error while a long step runs, and only
    there when it is a terminal: piped output, ``--json`` and logs stay as they are. The
    spinner is gone when the step ends; the function yielded replaces the message."""
    if not err.is_terminal:
        yield lambda _: None
        return
    with err.status(message) as status:
        yield lambda text: status.update(text)


def setup_logging(verbose: int) -> None:
    """Log to standard error (:mod:`reaper.logs`: readable on a terminal, JSON lines
    otherwise): 0 INFO (Temporal SDK warnings only), 1 also the agent's DEBUG lines (one
    per beat), 2 or more DEBUG everywhere."""
    from reaper.logs import setup_logging as setup

    setup(logging.DEBUG if verbose > 1 else logging.INFO)
    if verbose <= 1:
        logging.getLogger("temporalio").setLevel(logging.WARNING)
    if verbose == 1:
        logging.getLogger("reaper.agent").setLevel(logging.DEBUG)


async def connect_temporal(settings: ConnectionSettings) -> Any:
    """A Temporal client for an operator command, retrying for ``CLI_CONNECT_DEADLINE_S``.

    Returns:
        A connected ``temporalio.client.Client`` (pydantic data converter).

    Raises:
        CliError: Temporal is unreachable; the message says where it was looked for.
    """
    from reaper.core.contract import DEFAULT_ADDRESS
    from reaper.infra.db import Unreachable
    from reaper.infra.temporal import connect

    logging.getLogger("reaper.temporal").setLevel(logging.ERROR)
    target = settings.temporal_address or DEFAULT_ADDRESS
    try:
        with progress(f"connecting to Temporal at {target}…"):
            return await connect(
                settings.temporal_address, settings.namespace, deadline_s=CLI_CONNECT_DEADLINE_S
            )
    except Unreachable:
        raise CliError(
            f"Temporal unreachable at {target} after {CLI_CONNECT_DEADLINE_S:g}s "
            "(is `reaper run` running? otherwise set REAPER_TEMPORAL_ADDRESS "
            "or --address)"
        ) from None
