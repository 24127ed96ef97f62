"""A reference agent: the process on each worker that heartbeats to reaper.

It depends on the public contract only (:mod:`reaper.core.contract`,
:mod:`reaper.core.protocol`) and the Temporal client: no workflow code, no database. How it
connects is in :mod:`reaper.cli.agent_connection` (``client_factory`` is re-exported here).

Its local state is a directory with three subdirectories, ``containers``, ``volumes`` and
``tasks``; each entry's name is a handle (names starting with ``.`` are ignored, so a tool can
write ``.tmp`` files and rename them). Every heartbeat interval it:

1. sends a ``heartbeat`` by signal-with-start on ``liveness-{worker}`` with a fresh ``boot_id``
   per process start, ``seq`` from 0 strictly increasing, and the COMPLETE lists of entries;
2. queries ``state`` and applies it: each id in ``assignments`` becomes ``tasks/<id>`` (the
   task is started), each handle in ``orphans_by_kind`` (or, from an older controller,
   ``orphans``) is
   removed from its kind's directory.

Temporal being unreachable is logged and retried at the next interval; the agent never exits
on its own. A stop is a restart (nothing is reaped) unless ``retire_on_stop`` is set: then,
when it stops, it signals ``retire`` to its liveness (CONTRACT.md §5.1), for a host that is
being removed for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import cast

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from reaper.cli.agent_connection import ClientFactory, client_factory, short_error
from reaper.core.contract import (
    HEARTBEAT_SIGNAL,
    KINDS,
    LIVENESS_WORKFLOW,
    RETIRE_SIGNAL,
    STATE_QUERY,
    StateView,
    liveness_id,
)
from reaper.core.protocol import build_beats

__all__ = ["Agent", "ClientFactory", "client_factory", "list_entries", "remove_entry"]

log = logging.getLogger("reaper.agent")

RETIRE_ON_STOP_REASON = "agent stopped with --retire-on-stop"
"""The ``reason`` of the ``retire`` an agent sends when it stops with ``retire_on_stop``."""
RETIRE_DEADLINE_S = 10.0
"""How long a stopping agent keeps trying to deliver its ``retire``, in seconds."""


def list_entries(directory: Path) -> list[str]:
    """Names of the entries of ``directory`` (dot-files excluded), sorted."""
    try:
        return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))
    except FileNotFoundError:
        return []


def remove_entry(path: Path) -> bool:
    """Remove a file or a directory tree; True if something was removed."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        return True
    except FileNotFoundError:
        return False


@dataclass
class Agent:
    """One worker's agent.

    Args:
        worker: the worker's name (1-253 characters of ``[A-Za-z0-9._:-]``).
        state_dir: directory holding ``containers/``, ``volumes/`` and ``tasks/``.
        task_queue: the controller's task queue (signal-with-start starts the workflow there).
        interval: seconds between heartbeats (``REAPER_HEARTBEAT_INTERVAL``).
        client_factory: returns a connected Temporal client; called again after a failure.
        retire_on_stop: when :meth:`run` ends, signal ``retire`` (the host leaves for good).
    """

    worker: str
    state_dir: Path
    task_queue: str
    interval: float
    client_factory: ClientFactory
    retire_on_stop: bool = False
    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    seq: int = 0
    beats_sent: int = 0
    failures: int = 0
    last_view: StateView | None = None
    _client: Client | None = None
    _failing: str | None = None
    _last_state: tuple[str, bool] | None = None

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        for kind in KINDS:
            (self.state_dir / kind).mkdir(parents=True, exist_ok=True)

    def snapshot(self) -> dict[str, list[str]]:
        """The complete lists of handles held now, per kind."""
        return {kind: list_entries(self.state_dir / kind) for kind in KINDS}

    def next_beats(self) -> list[dict[str, object]]:
        """The next heartbeat payloads; each takes the next ``seq``.

        Unchanged lists the controller already holds go as digests only, changed small ones
        inline, changed large ones in chunks (:mod:`reaper.core.protocol`).
        """
        known = self.last_view.report_digests if self.last_view is not None else None
        beats = build_beats(self.worker, self.boot_id, self.seq, self.snapshot(), known)
        self.seq += len(beats)
        return beats

    async def beat_once(self) -> StateView | None:
        """Send one heartbeat, query ``state`` and apply it; ``None`` if either failed."""
        began = time.monotonic()
        timeout = timedelta(seconds=max(2.0, min(self.interval * 2, 10.0)))
        step = "connect to Temporal"
        try:
            client = await self._get_client()
            step = "heartbeat"
            for payload in self.next_beats():
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
            # The query must not delay the next beat: it gets what is left of this interval.
            left = max(1.0, self.interval - (time.monotonic() - began))
            view: StateView = await handle.query(
                STATE_QUERY, result_type=StateView, rpc_timeout=timedelta(seconds=left)
            )
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
        self.apply(view)
        return view

    def apply(self, view: StateView) -> tuple[list[str], list[str]]:
        """Start assigned tasks and remove orphans; returns ``(started, removed)``."""
        state = (view.state, view.draining)
        if state != self._last_state:
            log.info(
                "worker %s is %s%s", self.worker, view.state, " (draining)" if view.draining else ""
            )
            self._last_state = state
        started = []
        for task_id in view.assignments:
            path = self.state_dir / "tasks" / task_id
            if "/" in task_id or task_id in (".", "..") or path.exists():
                continue
            path.touch()
            started.append(task_id)
            log.info("started task %s", task_id)
        removed = []
        # Per kind when the controller says (a name may be a handle of two kinds); the
        # plain list of CONTRACT.md §2 otherwise.
        by_kind = view.orphans_by_kind or {kind: view.orphans for kind in KINDS}
        for kind, handles in by_kind.items():
            if kind not in KINDS:
                continue
            for handle in handles:
                if "/" in handle or handle in (".", ".."):
                    continue
                if remove_entry(self.state_dir / kind / handle):
                    removed.append(handle)
                    log.info("removed orphan %s/%s", kind, handle)
        return started, removed

    async def run(self, stop: asyncio.Event | None = None) -> bool:
        """Beat every ``interval`` seconds until ``stop`` is set; then, with
        ``retire_on_stop``, signal ``retire``.

        Returns:
            False if a ``retire`` was due and could not be delivered; True otherwise.
        """
        stop = stop or asyncio.Event()
        log.info(
            "agent %s starting: boot_id %s, state in %s, every %gs",
            self.worker,
            self.boot_id,
            self.state_dir,
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
        if not self.retire_on_stop:
            return True
        return await self.retire(RETIRE_ON_STOP_REASON)

    async def retire(self, reason: str, deadline_s: float = RETIRE_DEADLINE_S) -> bool:
        """Signal ``retire`` to this worker's running liveness (by name, plain JSON).

        Retried until delivered or ``deadline_s`` seconds have passed. Beats of this boot
        still in flight are ignored by the controller once the retirement is done.

        Returns:
            True once delivered; False if Temporal stayed unreachable or there is no running
            ``liveness-{worker}`` (never registered, or retired already).
        """
        # The boot it retires: delivered late, after this host restarted, it must not
        # retire the new boot (policy.fleet.retire_is_stale).
        payload = {"reason": reason, "actor": "agent", "boot_id": self.boot_id}
        wf_id = liveness_id(self.worker)
        give_up = time.monotonic() + deadline_s
        while True:
            left = give_up - time.monotonic()
            try:
                client = await asyncio.wait_for(self._get_client(), timeout=max(left, 0.1))
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

    async def _get_client(self) -> Client:
        if self._client is None:
            self._client = await self.client_factory()
        return self._client
