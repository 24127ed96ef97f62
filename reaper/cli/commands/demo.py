"""``reaper demo``: the finite end-to-end run of :mod:`reaper.cli.demo`."""

from __future__ import annotations

import typer

from reaper.cli.app import app, console, exit_now


@app.command(short_help="A finite end-to-end demo on a private stack (about 35 s).")
def demo(
    keep: bool = typer.Option(False, "--keep", help="Keep the temporary state directory."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show progress details."),
) -> None:
    """A finite end-to-end run on its own embedded stack (own ports, own temporary state):
    three agents, a missing volume destroyed after its TTL, a killed agent reaped and its task
    replaced, the agent's return without a duplicate, a scale-in (an agent retires on stop) and a
    scale-out (owed work placed on a new agent). Exits 0 only if all was observed."""
    from reaper.cli.demo import run_demo

    code = run_demo(console, keep=keep, verbose=verbose)
    exit_now(code)
