"""``reaper drain``, ``undrain``, ``retire`` and ``force-reap``: an operator's signal to one
worker's liveness.

Each refuses an unknown worker (no running ``liveness-WORKER``) with exit status 1; the
signal carries ``{"reason": ..., "actor": ...}`` (CONTRACT.md §2, §5.1), the actor being
``$USER``, or ``operator`` when ``$USER`` is unset or empty.

With ``--key-file FILE`` (env ``REAPER_OPERATOR_KEY_FILE``) the signal is signed for the
worker with that Ed25519 key, ``signed_at`` from this host's clock (CONTRACT.md §5.2), so it
acts in ``REAPER_AGENT_AUTH=required`` mode when the key's public half is in the
controllers' ``REAPER_OPERATOR_KEYS``; ``pin`` and ``off`` take it signed or not. The
liveness's ``state`` query is read before and after the signal: when its ``rejected`` count
grew with a rejection of this signal, the command says why and exits 1 (an unsigned signal
in ``required`` mode, an unknown key, a clock more than 5 minutes off). Without a controller
to answer the query, the signal is reported as sent, unconfirmed.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    err,
    exit_now,
    fail,
)
from reaper.core.config import ConnectionSettings
from reaper.core.contract import (
    DRAIN_SIGNAL,
    FORCE_REAP_SIGNAL,
    RETIRE_SIGNAL,
    STATE_QUERY,
    UNDRAIN_SIGNAL,
    WORKER_NAME,
    StateView,
    liveness_id,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

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
CONFIRM_TIMEOUT_S = 5.0
"""How long each ``state`` query confirming a signal may take (seconds); with no answer (no
controller polling) the signal is reported as sent, unconfirmed."""


def operator_actor() -> str:
    """Who an operator signal is recorded as: ``$USER``, or ``operator`` when it is unset or
    empty."""
    return os.environ.get("USER") or "operator"


async def _rejections(handle: Any) -> tuple[int, str | None] | None:
    """The liveness's ``rejected`` count and ``last_rejection``; ``None`` if the ``state``
    query got no answer within :data:`CONFIRM_TIMEOUT_S` (no controller polling)."""
    try:
        view: StateView = await handle.query(
            STATE_QUERY, result_type=StateView, rpc_timeout=timedelta(seconds=CONFIRM_TIMEOUT_S)
        )
    except Exception:
        return None
    return view.rejected, view.last_rejection


def rejected_message(name: str, reason: str, signed: bool) -> str:
    """What the operator reads when the liveness rejected signal ``name`` for ``reason``."""
    if signed:
        return (
            f"the controller rejected {name}: {reason} (is this key's public key in the "
            "controllers' REAPER_OPERATOR_KEYS, and this host's clock within 5 minutes of theirs?)"
        )
    return (
        f"the controller rejected {name}: {reason} (in REAPER_AGENT_AUTH=required mode, "
        "sign it: --key-file FILE or REAPER_OPERATOR_KEY_FILE, a key made by `reaper keygen` "
        "whose public key is in the controllers' REAPER_OPERATOR_KEYS)"
    )


async def signal_worker(
    settings: ConnectionSettings,
    worker: str,
    name: str,
    reason: str,
    key: Ed25519PrivateKey | None = None,
) -> tuple[str, bool]:
    """Send operator signal ``name`` (``force_reap``, ``drain``, ``undrain``, ``retire``) to a
    running liveness, signed with ``key`` if given (CONTRACT.md §5.2: ``worker``,
    ``signed_at`` from this host's UTC clock, ``signal``, ``sig``).

    Returns:
        The actor recorded with the signal (``$USER``, or ``operator``), and whether the
        controller answered the ``state`` queries around it (False: sent, unconfirmed).

    Raises:
        CliError: the worker is unknown (no running ``liveness-{worker}``), Temporal is down,
            or the liveness rejected the signal (its ``rejected`` count grew with a rejection
            of ``name``).
    """
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError, RPCStatusCode

    from reaper.core.signing import sign_operator_signal

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
    payload: dict[str, Any] = {"reason": reason, "actor": actor}
    if key is not None:
        payload = sign_operator_signal(payload, worker, key, signal=name)
    before = await _rejections(handle)
    await handle.signal(name, payload)
    # A query is answered after the signals sent before it are handled (Temporal's queries
    # are consistent), and a liveness rejects an operator signal in its handler.
    after = await _rejections(handle) if before is not None else None
    if before is not None and after is not None and after[0] > before[0]:
        last = after[1] or ""
        if last.startswith(f"{name}:"):
            raise CliError(rejected_message(name, last, signed=key is not None))
    return actor, after is not None


def _operator_signal(
    name: str,
    worker: str,
    reason: str,
    address: str | None,
    namespace: str | None,
    key_file: Path | None,
) -> None:
    from reaper.cli.keys import loose_mode, read_key
    from reaper.core.signing import public_key_text

    try:
        settings = connection_settings_from(temporal_address=address, namespace=namespace)
        key = read_key(key_file.expanduser(), "--key-file") if key_file is not None else None
        if key_file is not None and (warning := loose_mode(key_file.expanduser())):
            err.print(f"reaper: warning: {warning}", highlight=False, markup=False)
        actor, confirmed = asyncio.run(signal_worker(settings, worker, name, reason, key))
    except CliError as exc:
        fail(exc)
    except Exception as exc:
        fail(CliError(f"{name}: {exc}"))
    signed = f", signed by {public_key_text(key)}" if key is not None else ""
    console.print(
        f"sent {name} to liveness-{worker} (reason: {reason!r}, actor: {actor}{signed})",
        highlight=False,
        markup=False,
    )
    if not confirmed:
        err.print(
            f"reaper: not confirmed: no controller answered liveness-{worker}'s state query "
            f"within {CONFIRM_TIMEOUT_S:g}s; the signal waits in Temporal for one",
            highlight=False,
            markup=False,
        )
    exit_now(0)


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
    _operator_signal(FORCE_REAP_SIGNAL, worker, reason, address, namespace, key_file)


@app.command(short_help="Place nothing new on WORKER.", cls=PlainArgumentsCommand)
def drain(
    worker: str = typer.Argument(..., metavar="WORKER", help="The worker's name."),
    reason: str = REASON_OPTION,
    key_file: Path | None = KEY_FILE_OPTION,
    address: str | None = ADDRESS_OPTION,
    namespace: str | None = NAMESPACE_OPTION,
) -> None:
    """Drain WORKER: nothing new is placed on it."""
    _operator_signal(DRAIN_SIGNAL, worker, reason, address, namespace, key_file)


@app.command(short_help="Let placements on WORKER resume.", cls=PlainArgumentsCommand)
def undrain(
    worker: str = typer.Argument(..., metavar="WORKER", help="The worker's name."),
    reason: str = REASON_OPTION,
    key_file: Path | None = KEY_FILE_OPTION,
    address: str | None = ADDRESS_OPTION,
    namespace: str | None = NAMESPACE_OPTION,
) -> None:
    """Undrain WORKER: placements on it resume (owed work may be placed there)."""
    _operator_signal(UNDRAIN_SIGNAL, worker, reason, address, namespace, key_file)


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
    _operator_signal(RETIRE_SIGNAL, worker, reason, address, namespace, key_file)
