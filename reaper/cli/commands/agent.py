"""``reaper agent``: run the reference agent (:mod:`reaper.cli.agent`) for one worker, on a
runtime (:mod:`reaper.cli.runtimes`): ``directory`` (the default) or ``docker``.

``--key-file FILE`` (env ``REAPER_AGENT_KEY_FILE``) signs its beats and its ``retire``
(CONTRACT.md §5.2). The file is created (Ed25519, mode 0600) on the first start when it does
not exist: it is the host's identity, as an SSH host key is made on a host's first boot, and
the worker's first signed beat pins it unless the operator enrolled a key beforehand. It must
outlive the agent (not a container's writable layer, not the state directory the scheduler
writes to): a host that loses it is rejected until an operator removes its pin. There is no
default file: an agent signs only when told to, since in ``pin`` mode (the default) its first
signed beat pins a key that every later start must then hold.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

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
from reaper.core.config import ConfigError
from reaper.core.config_values import parse_duration
from reaper.core.contract import KINDS
from reaper.core.kinds import spoken

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from reaper.cli.agent_metrics import AgentMetrics
    from reaper.cli.runtimes import Runtime

DEFAULT_ENGINE = "unix:///var/run/docker.sock"
"""Docker's socket, the engine of ``--runtime docker`` when neither ``--engine`` nor
``DOCKER_HOST`` says otherwise (docker-py's and the docker CLI's default)."""
DEFAULT_STOP_GRACE = "10s"
"""Between SIGTERM and SIGKILL when an orphaned container is stopped: ``docker stop``'s
default."""


class RuntimeName(str, Enum):
    """``--runtime``: where the worker's handles live."""

    directory = "directory"
    docker = "docker"


def docker_runtime(
    worker: str,
    engine: str | None,
    templates: Path | None,
    stop_grace: float,
    interval: float,
    metrics: AgentMetrics,
) -> Runtime:
    """The ``docker`` runtime on ``engine`` (default ``DOCKER_HOST``, then
    :data:`DEFAULT_ENGINE`). An engine call may take half a heartbeat interval, between 1
    and 10 seconds: the beat goes out on time, liveness only if the engine is slower."""
    from reaper.cli.runtimes.docker import DockerRuntime
    from reaper.cli.runtimes.engine import Engine
    from reaper.cli.runtimes.templates import Templates

    url = engine or os.environ.get("DOCKER_HOST") or DEFAULT_ENGINE
    timeout = min(max(interval / 2, 1.0), 10.0)
    return DockerRuntime(
        worker, Engine(url, timeout, metrics), Templates(templates), stop_grace, metrics
    )


def agent_key(path: Path) -> tuple[Ed25519PrivateKey, bool]:
    """The agent's key at ``path`` (``~`` expanded), created (mode 0600) if it does not exist.

    Returns:
        The key, and whether this call created it.

    Raises:
        CliError: exit status 2: the file cannot be read or written, or holds no Ed25519
            private key.
    """
    from reaper.cli.keys import read_key

    path = path.expanduser()
    existed = path.exists()
    return read_key(path, "--key-file", create=True), not existed


@app.command(short_help="A reference agent: heartbeats a state directory or a container engine.")
def agent(
    worker: str = typer.Option(..., "--worker", metavar="NAME", help="This worker's name."),
    runtime: RuntimeName = typer.Option(
        RuntimeName.directory,
        "--runtime",
        help="Where the worker's handles live: directory (--state-dir) or docker (the "
        "labelled objects of a Docker Engine API, Docker or Podman; "
        "docs/agent-runtimes.md).",
    ),
    state_dir: Path | None = typer.Option(
        None,
        "--state-dir",
        metavar="DIR",
        help=f"directory: the directory holding {spoken(*(f'{k}/' for k in KINDS), last='and')}"
        " (created if missing).",
    ),
    engine: str | None = typer.Option(
        None,
        "--engine",
        metavar="URL",
        help="docker: the Engine API's socket, such as unix:///run/podman/podman.sock "
        f"(env DOCKER_HOST; default {DEFAULT_ENGINE}).",
    ),
    templates: Path | None = typer.Option(
        None,
        "--templates",
        metavar="DIR",
        help="docker: the task templates, DIR/<service>.toml; without them no task is "
        "started (each is logged and counted).",
    ),
    stop_grace: str = typer.Option(
        DEFAULT_STOP_GRACE,
        "--stop-grace",
        metavar="DURATION",
        help="docker: how long an orphaned container gets between SIGTERM and SIGKILL.",
    ),
    metrics_port: int = typer.Option(
        0,
        "--metrics-port",
        metavar="PORT",
        help="Serve the agent's Prometheus series on PORT (/metrics); 0, the default, serves none.",
    ),
    address: str | None = ADDRESS_OPTION,
    namespace: str | None = NAMESPACE_OPTION,
    task_queue: str | None = TASK_QUEUE_OPTION,
    heartbeat_interval: str | None = typer.Option(
        None,
        metavar="DURATION",
        help="How often to beat (env REAPER_HEARTBEAT_INTERVAL; default 10s).",
    ),
    key_file: Path | None = typer.Option(
        None,
        "--key-file",
        envvar="REAPER_AGENT_KEY_FILE",
        show_envvar=False,
        metavar="FILE",
        help="Sign beats and the retire with this Ed25519 private key, created (mode 0600) "
        "if missing, as REAPER_AGENT_AUTH=required needs; keep it outside the state "
        "directory (env REAPER_AGENT_KEY_FILE; default unsigned).",
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
    """A reference agent: heartbeats what the host holds (the entries of --state-dir, or
    with --runtime docker the labelled objects of a container engine) and
    applies what reaper says (assigned tasks are started, orphans removed). Runs until
    Ctrl-C or SIGTERM; exits 1 if --retire-on-stop could not deliver its retire signal."""
    from reaper.cli.agent import Agent, AgentMetrics, client_factory
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
        if runtime is RuntimeName.directory and state_dir is None:
            raise CliError("--state-dir is needed with --runtime directory", code=2)
        try:
            grace = parse_duration(stop_grace)
        except (ConfigError, ValueError) as exc:
            raise CliError(f"--stop-grace: {exc}", code=2) from None
        if not 0 <= metrics_port <= 65535:
            raise CliError(f"--metrics-port: not a TCP port: {metrics_port}", code=2)
        key, created = agent_key(key_file) if key_file is not None else (None, False)
    except CliError as exc:
        fail(exc)
    setup_logging(verbose)
    if key_file is not None and key is not None:
        log_key(key_file.expanduser(), key, created)
    metrics = AgentMetrics()
    if metrics_port:
        metrics.serve(metrics_port)
    the_runtime = None
    if runtime is RuntimeName.docker:
        the_runtime = docker_runtime(
            worker, engine, templates, grace, settings.heartbeat_interval, metrics
        )
    the_agent = Agent(
        worker=worker,
        state_dir=state_dir,
        runtime=the_runtime,  # None: the directory of state_dir
        metrics=metrics,
        task_queue=settings.task_queue,
        interval=settings.heartbeat_interval,
        client_factory=client_factory(
            settings.temporal_address, settings.namespace, settings.heartbeat_interval
        ),
        retire_on_stop=retire_on_stop,
        key=key,
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


def log_key(path: Path, key: Ed25519PrivateKey, created: bool) -> None:
    """One line naming the agent's key file and public key (to enrol or check a pin), and a
    warning if the file may be read by others."""
    from reaper.cli.keys import loose_mode
    from reaper.core.signing import public_key_text

    log = logging.getLogger("reaper.agent")
    verb = "created" if created else "read"
    log.info("signing with the key %s from %s: public key %s", verb, path, public_key_text(key))
    if warning := loose_mode(path):
        log.warning("the agent's key %s", warning)
