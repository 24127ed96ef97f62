"""Simulated agents: workers heartbeating from one asyncio process, speaking the agent
protocol as ``reaper agent`` does (CONTRACT.md §2): a ``heartbeat`` by signal-with-start of
``WorkerLiveness`` on ``liveness-{worker}``, by name and plain JSON, and the ``state`` query.
Beats are built by the agent's own code (:func:`reaper.core.protocol.build_beats`), so a
simulated agent sends what a real one would.

:class:`SimAgent` is one worker's identity and complete lists;
:class:`reaper.kit.fleet.SimFleet` beats many of them in the background.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from reaper.core.contract import (
    HEARTBEAT_SIGNAL,
    KINDS,
    LIVENESS_WORKFLOW,
    STATE_QUERY,
    StateView,
    liveness_id,
)
from reaper.core.protocol import build_beats
from reaper.core.signing import sign_heartbeat

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from temporalio.client import Client, WorkflowHandle


def _timeout(seconds: float | None) -> timedelta | None:
    return timedelta(seconds=seconds) if seconds is not None else None


async def send_heartbeat(
    client: Client,
    task_queue: str,
    payload: Any,
    *,
    worker: str | None = None,
    rpc_timeout: float | None = None,
    workflow: str | None = None,
) -> WorkflowHandle[Any, Any]:
    """One heartbeat, as an agent sends it: signal-with-start of ``heartbeat`` on
    ``liveness-{worker}`` (the workflow started on ``task_queue`` if it is not running).

    Args:
        payload: the heartbeat (any JSON value: the controller judges it, not this function).
        worker: whose liveness receives it; ``payload["worker"]`` when ``None``.
        rpc_timeout: seconds for the call; the client's default when ``None``.
        workflow: send it to a workflow of this type instead, id ``{workflow}-{worker}``,
            started without input: a baseline taking the same beats as reaper's liveness
            (the bench's ``BenchNoop``, bench/noop.py).

    Returns:
        A handle of the liveness.

    Raises:
        temporalio.service.RPCError: the server refused or did not answer the call.
    """
    name = worker or str(payload["worker"])
    return await client.start_workflow(
        workflow or LIVENESS_WORKFLOW,
        None if workflow else {"worker": name},
        id=f"{workflow}-{name}" if workflow else liveness_id(name),
        task_queue=task_queue,
        start_signal=HEARTBEAT_SIGNAL,
        start_signal_args=[payload],
        rpc_timeout=_timeout(rpc_timeout),
    )


async def query_state(
    client: Client, worker: str, *, rpc_timeout: float | None = None
) -> StateView:
    """The ``state`` query of ``worker``'s liveness, as an agent reads it.

    Raises:
        temporalio.service.RPCError: no such workflow, or no controller answered.
    """
    return await client.get_workflow_handle(liveness_id(worker)).query(
        STATE_QUERY, result_type=StateView, rpc_timeout=_timeout(rpc_timeout)
    )


@dataclass
class SimAgent:
    """One simulated agent.

    Args:
        name: the worker's name.
        lists: complete lists per kind (``containers``, ``volumes``, ``tasks``) sent with
            every beat; a kind left out is not reported; ``None``: liveness-only beats.
        boot_id: its boot id (a fresh one by default).
        seq: ``seq`` of its next beat.
        key: its Ed25519 key: its beats are signed (CONTRACT.md §5.2) when set.
    """

    name: str
    lists: dict[str, list[str]] | None = None
    boot_id: str = field(default_factory=lambda: f"boot-{uuid.uuid4().hex[:10]}")
    seq: int = 0
    key: Ed25519PrivateKey | None = None
    alive: bool = True
    """It beats while True (False: silent, as after a SIGKILL of its agent)."""
    next_due: float = 0.0
    """When its next beat is due (``time.monotonic()``)."""
    in_flight: int = 0
    """Its beats in flight now."""
    last_sent: float | None = None
    """Wall-clock time (``time.time()``) at which its last beat was accepted."""
    accepted: list[tuple[float, int]] | None = None
    """``(time.monotonic() when it was sent, seq)`` of every beat the server accepted, when
    given a list (``None``: not kept; a fleet of thousands beats for long). The time it
    left, not its answer's: on a loaded machine the answer reaches a busy caller seconds
    after the controller had the beat (tests/e2e/test_outage.py's premise)."""

    def report(self) -> Mapping[str, list[str]] | None:
        """The complete lists to send now (``lists``; a subclass may compute them)."""
        return self.lists

    def next_beats(self, with_lists: bool = True) -> list[dict[str, Any]]:
        """Its next heartbeats, each taking the next ``seq``: every list in full (inline, or
        in chunks when large), signed with ``key`` if set; ``with_lists=False``: one
        liveness-only beat."""
        lists = self.report() if with_lists else None
        beats = build_beats(self.name, self.boot_id, self.seq, lists or {})
        self.seq += len(beats)
        if self.key is not None:
            beats = [sign_heartbeat(b, self.key) for b in beats]
        return beats

    def payload(self, with_lists: bool = True) -> dict[str, Any]:
        """Its next heartbeat, for lists small enough to go in one.

        Raises:
            ValueError: the lists need more than one beat (use :meth:`next_beats`).
        """
        beats = self.next_beats(with_lists)
        if len(beats) != 1:
            raise ValueError(f"{self.name}'s lists need {len(beats)} beats")
        return beats[0]

    async def beat(
        self, client: Client, task_queue: str, rpc_timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """Send its next heartbeats (:meth:`next_beats`); returns them once all were
        accepted."""
        beats = self.next_beats()
        await self.send(client, task_queue, beats, rpc_timeout)
        return beats

    async def send(
        self,
        client: Client,
        task_queue: str,
        beats: list[dict[str, Any]],
        rpc_timeout: float | None = None,
        workflow: str | None = None,
    ) -> None:
        """Send ``beats`` in order (to a baseline ``workflow`` if given, as
        :func:`send_heartbeat`); records the last one as accepted once all were."""
        sent = time.monotonic()
        for payload in beats:
            sent = time.monotonic()
            await send_heartbeat(
                client, task_queue, payload, rpc_timeout=rpc_timeout, workflow=workflow
            )
        self.last_sent = time.time()
        if self.accepted is not None:
            self.accepted.append((sent, int(beats[-1]["seq"])))

    def apply(self, view: StateView) -> None:
        """Apply a ``state`` answer as the reference agent does: each id in ``assignments``
        is a task started, each handle in ``orphans_by_kind`` is destroyed."""
        lists = self.lists if self.lists is not None else {}
        tasks = lists.setdefault("tasks", [])
        tasks += [t for t in view.assignments if t not in tasks]
        for kind, handles in view.orphans_by_kind.items():
            if kind in KINDS and kind in lists:
                lists[kind] = [h for h in lists[kind] if h not in handles]
        self.lists = lists

    def reboot(self, wiped: bool = False) -> None:
        """A new boot id, ``seq`` from 0; ``wiped``: fresh local state (holds nothing)."""
        self.boot_id, self.seq = f"boot-{uuid.uuid4().hex[:10]}", 0
        if wiped:
            self.lists = {kind: [] for kind in KINDS}
