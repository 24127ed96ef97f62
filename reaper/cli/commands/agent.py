"""``reaper agent``: run the reference agent (:mod:`reaper.cli.agent`) for one worker."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import typer

from reaper.cli.app import (
    ADDRESS_OPTION,
    NAMESPACE_OPTION,
    TASK_QUEUE_OPTION,
    CliError,
    app,
    exit_now,
    fail,
    settings_from,
    setup_logging,
)


@app.command(short_help="A reference agent: heartbeats a state directory to reaper.")
def agent(
    worker: str = typer.Option(..., "--worker", metavar="NAME", help="This worker's name."),
    state_dir: Path = typer.Option(
        ...,
        "--state-dir",
        metavar="DIR",
        help="The directory holding containers/, volumes/ and tasks/ (created if missing).",
    ),
    address: str | None = ADDRESS_OPTION,
    namespace: str | None = NAMESPACE_OPTION,
    task_queue: str | None = TASK_QUEUE_OPTION,
    heartbeat_interval: str | None = typer.Option(
        None,
        metavar="DURATION",
        help="How often to beat (env REAPER_HEARTBEAT_INTERVAL; default 10s).",
    ),
    retire_on_stop: bool = typer.Option(
        False,
        "--retire-on-stop",
        help="On SIGTERM or Ctrl-C, send retire before exiting, for a host that is removed "
        "for good. Without it a stop is a restart and reaps nothing.",
    ),
    verbose: int = typer.Option(
        0,
        "--verbose",
        "-v",
        count=True,
        help="Log more: -v one line per beat, -vv everything.",
        show_default=False,
    ),
) -> None:
    """A reference agent: heartbeats the contents of STATE_DIR and applies what reaper says
    (assigned tasks are started, orphans removed). Runs until Ctrl-C or SIGTERM; exits 1 if
    --retire-on-stop could not deliver its retire signal."""
    from reaper.cli.agent import Agent, client_factory
    from reaper.core.contract import WORKER_NAME

    try:
        settings = settings_from(
            temporal_address=address,
            namespace=namespace,
            task_queue=task_queue,
            heartbeat_interval=heartbeat_interval,
        )
        if not WORKER_NAME.match(worker):
            raise CliError(f"--worker {worker!r}: use 1-253 characters of [A-Za-z0-9._:-]")
    except CliError as exc:
        fail(exc)
    setup_logging(verbose)
    the_agent = Agent(
        worker=worker,
        state_dir=state_dir,
        task_queue=settings.task_queue,
        interval=settings.heartbeat_interval,
        client_factory=client_factory(
            settings.temporal_address, settings.namespace, settings.heartbeat_interval
        ),
        retire_on_stop=retire_on_stop,
    )

    async def main_loop() -> bool:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await the_agent.run(stop)

    done = asyncio.run(main_loop())
    logging.getLogger("reaper.agent").info(
        "agent %s stopped after %d beats%s",
        worker,
        the_agent.beats_sent,
        "" if done else "; its retire was not delivered",
    )
    exit_now(0 if done else 1)
