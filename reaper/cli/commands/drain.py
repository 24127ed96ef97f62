"""``reaper drain``, ``undrain``, ``retire`` and ``force-reap``: an operator's signal to one
worker's liveness.

Each refuses an unknown worker (no running ``liveness-WORKER``) with exit status 1; the
signal carries ``{"reason": ..., "actor": ...}`` (CONTRACT.md §2, §5.1), the actor being
``$USER``, or ``operator`` when ``$USER`` is unset or empty.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import typer

from reaper.cli.app import (
    ADDRESS_OPTION,
    NAMESPACE_OPTION,
    CliError,
    PlainArgumentsCommand,
    app,
    connect_temporal,
    connection_settings_from,
    console,
    exit_now,
    fail,
)
from reaper.core.config import ConnectionSettings
from reaper.core.contract import (
    DRAIN_SIGNAL,
    FORCE_REAP_SIGNAL,
    RETIRE_SIGNAL,
    UNDRAIN_SIGNAL,
    WORKER_NAME,
    liveness_id,
)

REASON_OPTION: Any = typer.Option(
    ...,
    "--reason",
    metavar="TEXT",
    help="Why, recorded in the events rows with the actor: $USER, or operator if $USER is "
    "unset or empty.",
)


def operator_actor() -> str:
    """Who an operator signal is recorded as: ``$USER``, or ``operator`` when it is unset or
    empty."""
    return os.environ.get("USER") or "operator"


async def signal_worker(settings: ConnectionSettings, worker: str, name: str, reason: str) -> str:
    """Send operator signal ``name`` (``force_reap``, ``drain``, ``undrain``, ``retire``) to a
    running liveness.

    Returns:
        The actor recorded with the signal (``$USER``, or ``operator``).

    Raises:
        CliError: the worker is unknown (no running ``liveness-{worker}``), or Temporal is down.
    """
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError, RPCStatusCode

    if not WORKER_NAME.match(worker):
        raise CliError(f"unknown worker {worker!r}: not a valid worker name")
    client = await connect_temporal(settings)
    wf_id = liveness_id(worker)
    handle = client.get_workflow_handle(wf_id)
    try:
        desc = await handle.describe()
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            raise CliError(
                f"unknown worker {worker!r}: no liveness workflow {wf_id} "
                f"in namespace {settings.namespace!r}"
            ) from None
        raise CliError(f"describe {wf_id}: {exc}") from None
    if desc.status is not WorkflowExecutionStatus.RUNNING:
        raise CliError(
            f"unknown worker {worker!r}: liveness workflow {wf_id} is not running "
            f"({desc.status.name.lower() if desc.status else 'unknown'})"
        )
    actor = operator_actor()
    await handle.signal(name, {"reason": reason, "actor": actor})
    return actor


def _operator_signal(
    name: str, worker: str, reason: str, address: str | None, namespace: str | None
) -> None:
    try:
        settings = connection_settings_from(temporal_address=address, namespace=namespace)
        actor = asyncio.run(signal_worker(settings, worker, name, reason))
    except CliError as exc:
        fail(exc)
    except Exception as exc:
        fail(CliError(f"{name}: {exc}"))
    console.print(
        f"sent {name} to liveness-{worker} (reason: {reason!r}, actor: {actor})", highlight=False
    )
    exit_now(0)


@app.command(
    "force-reap", short_help="Reap WORKER now and replace its tasks.", cls=PlainArgumentsCommand
)
def force_reap(
    worker: str = typer.Argument(..., metavar="WORKER", help="The worker's name."),
    reason: str = REASON_OPTION,
    address: str | None = ADDRESS_OPTION,
    namespace: str | None = NAMESPACE_OPTION,
) -> None:
    """Reap WORKER now: its tasks become lost and are replaced elsewhere."""
    _operator_signal(FORCE_REAP_SIGNAL, worker, reason, address, namespace)


@app.command(short_help="Place nothing new on WORKER.", cls=PlainArgumentsCommand)
def drain(
    worker: str = typer.Argument(..., metavar="WORKER", help="The worker's name."),
    reason: str = REASON_OPTION,
    address: str | None = ADDRESS_OPTION,
    namespace: str | None = NAMESPACE_OPTION,
) -> None:
    """Drain WORKER: nothing new is placed on it."""
    _operator_signal(DRAIN_SIGNAL, worker, reason, address, namespace)


@app.command(short_help="Let placements on WORKER resume.", cls=PlainArgumentsCommand)
def undrain(
    worker: str = typer.Argument(..., metavar="WORKER", help="The worker's name."),
    reason: str = REASON_OPTION,
    address: str | None = ADDRESS_OPTION,
    namespace: str | None = NAMESPACE_OPTION,
) -> None:
    """Undrain WORKER: placements on it resume (owed work may be placed there)."""
    _operator_signal(UNDRAIN_SIGNAL, worker, reason, address, namespace)


@app.command(short_help="Take WORKER out of the fleet for good.", cls=PlainArgumentsCommand)
def retire(
    worker: str = typer.Argument(..., metavar="WORKER", help="The worker's name."),
    reason: str = REASON_OPTION,
    address: str | None = ADDRESS_OPTION,
    namespace: str | None = NAMESPACE_OPTION,
) -> None:
    """Retire WORKER for good (scale-in, decommission): its tasks are replaced elsewhere now,
    its container and volume rows deleted, and it leaves the fleet."""
    _operator_signal(RETIRE_SIGNAL, worker, reason, address, namespace)
