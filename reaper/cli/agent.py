"""A reference agent: the process on each worker that heartbeats to reaper.

It depends on the public contract only (:mod:`reaper.core.contract`,
:mod:`reaper.core.protocol`) and the Temporal client: no workflow code, no database. How it
connects is in :mod:`reaper.cli.agent_connection` (``client_factory`` is re-exported here).

What the host holds is its runtime's (:mod:`reaper.cli.runtimes`): by default a directory
with ``containers/``, ``volumes/`` and ``tasks/`` whose entries are handles
(:mod:`reaper.cli.runtimes.directory`), or the labelled containers and volumes of a Docker
Engine API (:mod:`reaper.cli.runtimes.docker`). Every heartbeat interval the agent:

1. takes the runtime's inventory and sends a ``heartbeat`` by signal-with-start on
   ``liveness-{worker}`` with a fresh ``boot_id`` per process start, ``seq`` from 0 strictly
   increasing, and the COMPLETE lists; a list the runtime could not read goes as ``null``
   (liveness only: CONTRACT.md §2), never as ``[]``;
2. queries ``state`` (one query at a time; a beat waits for it no longer than its interval
   allows, and a later beat takes a late answer) and applies it in the background (a slow
   engine never delays the next beat): each id in ``assignments`` is started, each handle
   in ``orphans_by_kind`` (or, from an older controller, ``orphans``) removed. Nothing is
   applied on a beat whose inventory was incomplete (the engine is not answering).

Temporal being unreachable is logged and retried at the next interval; the agent never exits
on its own. A stop is a restart (nothing is reaped) unless ``retire_on_stop`` is set: then,
when it stops, it signals ``retire`` to its liveness (CONTRACT.md §5.1), for a host that is
being removed for good.

With a ``key`` (CONTRACT.md §5.2) its beats and its ``retire`` are signed, so it is heard in
``REAPER_AGENT_AUTH=required`` mode; a rejection of its beats is logged once per reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import cast

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from temporalio.client import Client

from reaper.cli.agent_connection import ClientFactory, StateAsker, client_factory, short_error
from reaper.cli.agent_metrics import AgentMetrics
from reaper.cli.agent_retire import RETIRE_DEADLINE_S, RETIRE_ON_STOP_REASON, send_retire
from reaper.cli.runtimes import Inventory, Runtime
from reaper.cli.runtimes.directory import DirectoryRuntime, list_entries, remove_entry
from reaper.core.contract import HEARTBEAT_SIGNAL, KINDS, LIVENESS_WORKFLOW, StateView, liveness_id
from reaper.core.protocol import build_beats
from reaper.core.signing import sign_heartbeat

__all__ = [
    "Agent",
    "AgentMetrics",
    "ClientFactory",
    "client_factory",
    "list_entries",
    "remove_entry",
]

log = logging.getLogger("reaper.agent")


@dataclass
class Agent:
    """One worker's agent.

    Args:
        worker: the worker's name (1-253 characters of ``[A-Za-z0-9._:-]``).
        task_queue: the controller's task queue (signal-with-start starts the workflow there).
        interval: seconds between heartbeats (``REAPER_HEARTBEAT_INTERVAL``).
        client_factory: returns a connected Temporal client; called again after a failure.
        state_dir: the ``directory`` runtime's directory (``containers/``, ``volumes/``,
            ``tasks/``); used when no ``runtime`` is given.
        runtime: where the host's handles live (default: a :class:`DirectoryRuntime`).
        retire_on_stop: when :meth:`run` ends, signal ``retire`` (the host leaves for good).
        key: the agent's Ed25519 private key: beats and the ``retire`` are signed with it
            (CONTRACT.md §5.2); ``None`` sends them unsigned (v1, ``pin`` and ``off`` modes).
        metrics: the agent's Prometheus series (:mod:`reaper.cli.agent_metrics`).
    """

    worker: str
    task_queue: str
    interval: float
    client_factory: ClientFactory
    state_dir: Path | None = None
    runtime: Runtime | None = None
    retire_on_stop: bool = False
    key: Ed25519PrivateKey | None = None
    metrics: AgentMetrics = field(default_factory=AgentMetrics)
    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    seq: int = 0
    beats_sent: int = 0
    failures: int = 0
    last_view: StateView | None = None
    _client: Client | None = None
    _failing: str | None = None
    _last_state: tuple[str, bool] | None = None
    _last_rejection: str | None = None
    _actions: asyncio.Task[tuple[list[str], list[str]]] | None = None
    _asker: StateAsker = field(default_factory=StateAsker)

    def __post_init__(self) -> None:
        if self.runtime is None:
            if self.state_dir is None:
                raise ValueError("an Agent needs a runtime or a state_dir")
            self.state_dir = Path(self.state_dir)
            self.runtime = DirectoryRuntime(self.state_dir)

    @property
    def host(self) -> Runtime:
        """The runtime in use (``runtime``, or the directory of ``state_dir``)."""
        assert self.runtime is not None  # set by __post_init__
        return self.runtime

    def snapshot(self) -> Inventory:
        """The complete lists held now, per kind, read synchronously: the ``directory``
        runtime only (others are read by :meth:`beat_once`, through ``inventory``).

        Raises:
            TypeError: the runtime is not a directory.
        """
        if not isinstance(self.runtime, DirectoryRuntime):
            raise TypeError(f"snapshot() reads a directory runtime, not {self.runtime!r}")
        return self.runtime.snapshot()

    def next_beats(
        self, lists: Mapping[str, list[str] | None] | None = None
    ) -> list[dict[str, object]]:
        """The next heartbeat payloads for ``lists`` (default: :meth:`snapshot`); each takes
        the next ``seq``.

        Unchanged lists the controller already holds go as digests only, changed small ones
        inline, changed large ones in chunks (:mod:`reaper.core.protocol`); a ``None`` list
        is left out (not reported: liveness only).
        """
        known = self.last_view.report_digests if self.last_view is not None else None
        lists = self.snapshot() if lists is None else lists
        beats = build_beats(self.worker, self.boot_id, self.seq, lists, known)
        self.seq += len(beats)
        if self.key is not None:
            beats = [sign_heartbeat(beat, self.key) for beat in beats]
        return beats

    async def beat_once(self) -> StateView | None:
        """Take the inventory, send one heartbeat, query ``state`` and apply it in the
        background; ``None`` if the beat or the query failed or the answer is still due."""
        began = time.monotonic()
        timeout = timedelta(seconds=max(2.0, min(self.interval * 2, 10.0)))
        lists = await self.host.inventory()
        complete = all(lists.get(kind) is not None for kind in KINDS)
        step = "connect to Temporal"
        try:
            client = await self._get_client()
            step = "heartbeat"
            for payload in self.next_beats(lists):
                # By type name and plain JSON: the agent knows the contract, not the workflow.
                handle = await client.start_workflow(
                    LIVENESS_WORKFLOW,
                    {"worker": self.worker},
                    id=liveness_id(self.worker),
                    task_queue=self.task_queue,
                    start_signal=HEARTBEAT_SIGNAL,
                    start_signal_args=[payload],
                    rpc_timeout=timeout,
                )
                self.beats_sent += 1
                sizes = " ".join(
                    f"{k}={len(cast(list[str], payload[k]))}" for k in KINDS if k in payload
                )
                log.debug("beat seq=%s %s", payload["seq"], sizes)
            step = "state query"
            # The next beat must not wait: a later answer is taken by a later beat.
            left = max(1.0, self.interval - (time.monotonic() - began))
            deadline = max(10.0, 3 * self.interval)
            view = await self._asker.ask(handle, left, deadline, 2 * self.interval)
            if view is None:
                return None
        except Exception as exc:  # unreachable, timeouts, no controller polling yet
            self.failures += 1
            if self._failing != step:
                hint = " (is the controller running?)" if step == "state query" else ""
                log.warning(
                    "%s failed: %s%s; retrying every %gs",
                    step,
                    short_error(exc),
                    hint,
                    self.interval,
                )
            self._failing = step
            return None
        if self._failing is not None:
            log.info("heartbeat and state query succeed again")
        self._failing = None
        self.last_view = view
        self._log_state(view)
        if complete and (self._actions is None or self._actions.done()):
            # In the background: stopping a container takes its grace period, and the next
            # beat must not wait for it. A view that comes while one is applied is skipped:
            # the controller lists the same work again on the next answer.
            self._actions = asyncio.create_task(self.apply(view))
        return view

    def _log_state(self, view: StateView) -> None:
        """One line when the worker's state or draining changes, and one when the controller
        rejects this agent's beats for a reason it did not log before."""
        last = view.last_rejection  # a beat's rejection, and this boot's beats not heard
        if last and last.startswith("heartbeat:") and view.boot_id != self.boot_id:
            hint = "" if self.key is not None else " (unsigned: give the agent --key-file)"
            if last != self._last_rejection:
                log.warning("the controller rejects beats of %s: %s%s", self.worker, last, hint)
            self._last_rejection = last
        state = (view.state, view.draining)
        if state != self._last_state:
            log.info(
                "worker %s is %s%s", self.worker, view.state, " (draining)" if view.draining else ""
            )
            self._last_state = state

    async def apply(self, view: StateView) -> tuple[list[str], list[str]]:
        """Start assigned tasks and remove orphans through the runtime; returns
        ``(started, removed)``."""
        started = [t for t in view.assignments if await self._safely(self.host.start(t))]
        removed = []
        # Per kind when the controller says (a name may be a handle of two kinds); the
        # plain list of CONTRACT.md §2 otherwise.
        by_kind = view.orphans_by_kind or {kind: view.orphans for kind in KINDS}
        for kind, handles in by_kind.items():
            if kind not in KINDS:
                continue
            removed += [h for h in handles if await self._safely(self.host.remove(kind, h))]
        return started, removed

    async def _safely(self, action: Awaitable[bool]) -> bool:
        """An action's result; False, logged, if it raised (a bug, a disk error): the
        agent keeps beating and the controller lists the work again."""
        try:
            return await action
        except Exception:
            log.exception("an assignment or orphan could not be applied")
            return False

    async def run(self, stop: asyncio.Event | None = None) -> bool:
        """Beat every ``interval`` seconds until ``stop`` is set; then, with
        ``retire_on_stop``, signal ``retire``.

        Returns:
            False if a ``retire`` was due and could not be delivered; True otherwise.
        """
        stop = stop or asyncio.Event()
        log.info(
            "agent %s starting: boot_id %s, %s, every %gs",
            self.worker,
            self.boot_id,
            self.host.describe(),
            self.interval,
        )
        while not stop.is_set():
            started = time.monotonic()
            beat = asyncio.create_task(self.beat_once())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait({beat, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not beat.done():  # stop asked while a call hangs: do not wait for it
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat
                break
            wait = self.interval - (time.monotonic() - started)
            if wait > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=wait)
        if self._actions is not None and not self._actions.done():
            self._actions.cancel()  # a stop is a restart: the next boot is told again
            with contextlib.suppress(asyncio.CancelledError):
                await self._actions
        await self._asker.close()
        await self.host.close()
        if not self.retire_on_stop:
            return True
        return await self.retire(RETIRE_ON_STOP_REASON)

    async def retire(self, reason: str, deadline_s: float = RETIRE_DEADLINE_S) -> bool:
        """Signal ``retire`` for this boot to this worker's running liveness, signed with
        ``key`` if given (:func:`reaper.cli.agent_retire.send_retire`)."""
        return await send_retire(
            self._get_client, self.worker, self.boot_id, self.key, reason, deadline_s
        )

    async def _get_client(self) -> Client:
        if self._client is None:
            self._client = await self.client_factory()
        return self._client
