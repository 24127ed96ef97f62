"""``reaper``: the command-line tool, the shell around the controller.

Console script ``reaper = reaper.cli:main``. Commands: ``run`` (the embedded stack),
``agent`` (a reference agent), ``workers`` (the fleet), ``force-reap`` and ``drain``
(operator signals), ``demo`` (a finite end-to-end run). Every setting comes from ``REAPER_*``
variables (or ``.env``); flags override them.

The shell is the top layer: it may import ``workflows``, ``activities`` and ``reaper.core``;
nothing imports it. Modules:

- ``app``: the typer app, shared options, errors and exit handling;
- ``commands/``: one module per command;
- ``agent``: the reference agent, which speaks only the contract (``reaper.core.contract``);
- ``processes``, ``postgres``, ``stack``: the embedded stack of ``reaper run``;
- ``demo/``: the demo's runner and its steps.
"""

from __future__ import annotations

from reaper.cli import commands  # noqa: F401  (registers every command on app)
from reaper.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point: parse ``sys.argv`` and run the command.

    A usage error (unknown flag, missing argument, bad value) is one line on standard
    error, ``reaper: <what> (see `reaper COMMAND --help`)``, with exit status 2.
    """
    import sys

    from typer import Abort
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError

    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as exc:
        exc.show()
        code = exc.exit_code
    except UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "reaper"
        print(f"reaper: {exc.format_message().rstrip('.')} (see `{where} --help`)", file=sys.stderr)
        code = exc.exit_code
    except ClickException as exc:
        print(f"reaper: {exc.format_message()}", file=sys.stderr)
        code = exc.exit_code
    except Abort:
        code = 1
    sys.exit(code if isinstance(code, int) else 0)
