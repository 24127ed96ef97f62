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
import os
from datetime import timedelta
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
    connect_temporal,
    connection_settings_from,
    console,
    err,
    exit_now,
    fail,
)
from reaper.cli.commands.drain_wait import follow_drain
from reaper.core.config import ConnectionSettings
from reaper.core.config_values import parse_duration
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


UPDATE_TIMEOUT_S = 60.0
"""How long an update may wait for a controller to take it and answer (seconds): an update
no controller took in that time was never delivered, and changed nothing."""
STARTING_TRIES = 20
"""Tries of an update refused because the liveness is starting a run (half a second apart)."""
SIGNATURE_REFUSALS = ("signed", "signature", "REAPER_AGENT_AUTH")
"""Words of a refusal by who may speak (``policy.auth``): the command then says how to sign."""
OLDER_LINE = ("needs every controller on 1.2", "expected but not found")
"""Refusals that mean the liveness takes no updates (the 1.1 line): the signal is sent."""


class Sent:
    """What a command did: the actor recorded, and the answer (an update's JSON object), or
    for a signal whether the liveness's ``state`` query confirmed it."""

    def __init__(self, actor: str, answer: dict[str, Any] | None, confirmed: bool) -> None:
        self.actor = actor
        self.answer = answer
        self.confirmed = confirmed


async def _running_liveness(settings: ConnectionSettings, worker: str) -> tuple[Any, bool]:
    """The handle of ``worker``'s running liveness, and whether a controller polls its task
    queue now (an update with no one to take it would wait; a signal waits in Temporal).

    Raises:
        CliError: not a worker name, no such liveness, or it is not running.
    """
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
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
    polled = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=desc.task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return handle, bool(polled.pollers)


async def command_worker(
    settings: ConnectionSettings,
    worker: str,
    name: str,
    reason: str,
    key: Ed25519PrivateKey | None = None,
    extra: dict[str, Any] | None = None,
) -> Sent:
    """Send operator command ``name`` (``force_reap``, ``drain``, ``undrain``, ``retire``) to
    a running liveness as an update, or as a signal where the liveness takes no updates
    (the 1.1 line); signed with ``key`` if given (CONTRACT.md §5.2: ``worker``,
    ``signed_at`` from this host's UTC clock, ``signal``, ``sig``). ``extra`` joins the
    payload (a drain's ``migrate`` and ``deadline``).

    Raises:
        CliError: the worker is unknown, Temporal is down or no controller took the update
            in :data:`UPDATE_TIMEOUT_S`, or the liveness refused the command (the reason).
    """
    from reaper.core.signing import sign_operator_signal

    handle, served = await _running_liveness(settings, worker)
    actor = operator_actor()
    payload: dict[str, Any] = {"reason": reason, "actor": actor, **(extra or {})}
    if key is not None:
        payload = sign_operator_signal(payload, worker, key, signal=name)
    if served:
        answer = await _update(handle, name, payload, migrate=bool((extra or {}).get("migrate")))
        if answer is not None:
            return Sent(actor, answer, True)
    before = await _rejections(handle)
    await handle.signal(name, payload)
    # A query is answered after the signals sent before it are handled (Temporal's queries
    # are consistent), and a liveness rejects an operator signal in its handler.
    after = await _rejections(handle) if before is not None else None
    if before is not None and after is not None and after[0] > before[0]:
        last = after[1] or ""
        if last.startswith(f"{name}:"):
            raise CliError(rejected_message(name, last, signed=key is not None))
    return Sent(actor, None, after is not None)


async def _update(
    handle: Any, name: str, payload: dict[str, Any], migrate: bool
) -> dict[str, Any] | None:
    """Send ``name`` as an update; its answer, or ``None`` if the liveness takes no updates
    (the 1.1 line: the caller sends the signal). A refusal because the liveness is starting
    a run is asked again, for :data:`STARTING_TRIES` tries.

    Raises:
        CliError: refused (the reason; for a signature's, how to sign), no answer within
            :data:`UPDATE_TIMEOUT_S`, a migrating drain to a liveness that cannot migrate,
            or Temporal failed.
    """
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError

    why = ""
    for _ in range(STARTING_TRIES):
        try:
            answer: dict[str, Any] = await asyncio.wait_for(
                handle.execute_update(name, payload), UPDATE_TIMEOUT_S
            )
        except WorkflowUpdateFailedError as exc:
            why = str(exc.cause) if exc.cause is not None else str(exc)
            if "is starting a run" in why:
                await asyncio.sleep(0.5)
                continue
            break
        except TimeoutError:
            raise CliError(
                f"{name}: no controller answered within {UPDATE_TIMEOUT_S:g}s; it may still be"
                " taken once one serves this task queue (reaper events shows whether it was)"
            ) from None
        except RPCError as exc:
            raise CliError(f"{name}: {exc}") from None
        if not answer.get("accepted", False):
            raise CliError(f"{name} refused: {answer.get('reason', 'not accepted')}")
        return answer
    if any(marker in why for marker in SIGNATURE_REFUSALS):
        raise CliError(rejected_message(name, why, signed="sig" in payload))
    if migrate or not any(marker in why for marker in OLDER_LINE):
        raise CliError(f"{name} refused: {why}")
    return None


def describe_answer(name: str, worker: str, answer: dict[str, Any]) -> str:
    """An update's answer in one line: ``drain of w1: changed; draining; migrating until
    2026-12-07 15:04:05 UTC``."""
    parts = ["changed" if answer.get("changed") else "nothing to change"]
    if "draining" in answer:
        parts.append("draining" if answer["draining"] else "not draining")
    if answer.get("migrating") and answer.get("deadline"):
        parts.append(f"migrating until {utc_text(answer['deadline'])}")
    if answer.get("drained"):
        parts.append("drained")
    if "state" in answer:
        parts.append(f"{answer.get('was', '?')} -> {answer['state']}")
    return f"{name} of {worker}: {'; '.join(parts)}"


def utc_text(iso: str) -> str:
    """An ISO-8601 time as ``2026-12-07 15:04:05 UTC``."""
    from datetime import UTC, datetime

    return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


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
