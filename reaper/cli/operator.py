"""Sending an operator command to a worker's liveness (CONTRACT.md §6.3): as the Temporal
Update of its name, whose answer says what changed or why it was refused; as the signal
where the liveness takes no updates (the 1.1 line) or no controller polls its task queue.
What ``reaper drain``, ``undrain``, ``retire`` and ``force-reap`` share
(``reaper.cli.commands.drain``)."""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from reaper.cli.app import CliError, connect_temporal
from reaper.core.config import ConnectionSettings
from reaper.core.contract import STATE_QUERY, WORKER_NAME, StateView, liveness_id

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

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
