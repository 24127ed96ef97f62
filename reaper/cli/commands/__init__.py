"""The ``reaper`` commands, one module each; importing a module registers its command on
:data:`reaper.cli.app.app` (the order here is the order of ``reaper --help``)."""

from reaper.cli.commands import (  # noqa: F401  (registers them)
    agent,
    demo,
    drain,
    events,
    explain,
    keygen,
    reset,
    run,
    trial,
    upgrade_check,
    workers,
)
