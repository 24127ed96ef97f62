"""An agent's ``retire`` (CONTRACT.md §5.1): sent on a planned shutdown of its host, for its
own boot, signed with its key when it has one (§5.2: a worker may sign its own ``retire``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from reaper.cli.agent_connection import short_error
from reaper.core.contract import RETIRE_SIGNAL, liveness_id
from reaper.core.signing import sign_operator_signal

log = logging.getLogger("reaper.agent")

RETIRE_ON_STOP_REASON = "agent stopped with --retire-on-stop"
"""The ``reason`` of the ``retire`` an agent sends when it stops with ``retire_on_stop``."""
RETIRE_DEADLINE_S = 10.0
"""How long a stopping agent keeps trying to deliver its ``retire``, in seconds."""


async def send_retire(
    get_client: Callable[[], Awaitable[Client]],
    worker: str,
    boot_id: str,
    key: Ed25519PrivateKey | None,
    reason: str,
    deadline_s: float = RETIRE_DEADLINE_S,
) -> bool:
    """Signal ``retire`` to this worker's running liveness (by name, plain JSON).

    Retried until delivered or ``deadline_s`` seconds have passed. Beats of this boot
    still in flight are ignored by the controller once the retirement is done.

    Returns:
        True once delivered; False if Temporal stayed unreachable or there is no running
        ``liveness-{worker}`` (never registered, or retired already).
    """
    # The boot it retires: delivered late, after this host restarted, it must not
    # retire the new boot (policy.fleet.retire_is_stale).
    payload: dict[str, object] = {"reason": reason, "actor": "agent", "boot_id": boot_id}
    if key is not None:  # signed once: a retried delivery is the same signal
        payload = sign_operator_signal(payload, worker, key, signal=RETIRE_SIGNAL)
    wf_id = liveness_id(worker)
    give_up = time.monotonic() + deadline_s
    while True:
        left = give_up - time.monotonic()
        try:
            client = await asyncio.wait_for(get_client(), timeout=max(left, 0.1))
            handle = client.get_workflow_handle(wf_id)
            await handle.signal(
                RETIRE_SIGNAL, payload, rpc_timeout=timedelta(seconds=max(left, 1.0))
            )
        except RPCError as exc:
            if exc.status is RPCStatusCode.NOT_FOUND:
                log.warning("retire not sent: no running %s (%s)", wf_id, short_error(exc))
                return False
            error: BaseException = exc
        except Exception as exc:  # unreachable, a timeout
            error = exc
        else:
            log.info("sent retire to %s (reason: %s)", wf_id, reason)
            return True
        if time.monotonic() >= give_up:
            log.warning(
                "retire not sent to %s within %gs: %s", wf_id, deadline_s, short_error(error)
            )
            return False
        await asyncio.sleep(min(0.5, max(give_up - time.monotonic(), 0)))
