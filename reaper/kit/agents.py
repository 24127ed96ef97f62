"""Simulated agents: workers heartbeating from one asyncio process, speaking the agent
protocol as ``reaper agent`` does (CONTRACT.md §2): a ``heartbeat`` by signal-with-start of
``WorkerLiveness`` on ``liveness-{worker}``, by name and plain JSON, and the ``state`` query.
Beats are built by the agent's own code (:func:`reaper.core.protocol.build_beats`), so a
simulated agent sends what a real one would.

:class:`SimAgent` is one worker's identity and complete lists; :class:`SimFleet` beats every
agent every interval (phases spread, calls bounded, one beat of an agent in flight unless
told otherwise),
can silence, pause and resume one, and can read ``state`` and apply it as the reference
agent does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
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

TICK_S = 0.02
"""How often :class:`SimFleet` looks for agents whose beat is due, in seconds."""
QUERY_TIMEOUT_S = 5.0
"""A ``state`` query not answered within this is given up (a loaded controller answers
late), in seconds."""


def _timeout(seconds: float | None) -> timedelta | None:
    return timedelta(seconds=seconds) if seconds is not None else None


async def send_heartbeat(
    client: Client,
    task_queue: str,
    payload: Any,
    *,
    worker: str | None = None,
    rpc_timeout: float | None = None,
) -> WorkflowHandle[Any, Any]:
    """One heartbeat, as an agent sends it: signal-with-start of ``heartbeat`` on
    ``liveness-{worker}`` (the workflow started on ``task_queue`` if it is not running).

    Args:
        payload: the heartbeat (any JSON value: the controller judges it, not this function).
        worker: whose liveness receives it; ``payload["worker"]`` when ``None``.
        rpc_timeout: seconds for the call; the client's default when ``None``.

    Returns:
        A handle of the liveness.

    Raises:
        temporalio.service.RPCError: the server refused or did not answer the call.
    """
    name = worker or str(payload["worker"])
    return await client.start_workflow(
        LIVENESS_WORKFLOW,
        {"worker": name},
        id=liveness_id(name),
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
    """``(time.monotonic(), seq)`` of every beat the server accepted, when given a list
    (``None``: not kept; a fleet of thousands beats for long)."""

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
    ) -> None:
        """Send ``beats`` in order; records the last one as accepted once all were."""
        for payload in beats:
            await send_heartbeat(client, task_queue, payload, rpc_timeout=rpc_timeout)
        self.last_sent = time.time()
        if self.accepted is not None:
            self.accepted.append((time.monotonic(), int(beats[-1]["seq"])))

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


BeatHook = Callable[[SimAgent, list[dict[str, Any]], float, float | None], None]
"""Called after every beat attempt: the agent, its beats, when the send began and when the
server acknowledged it (``time.time()``; ``None``: refused or timed out)."""


class SimFleet:
    """Agents beating every ``interval`` seconds until stopped.

    Args:
        client: the Temporal client every agent calls through.
        task_queue: the controller's task queue.
        interval: seconds between two beats of an agent.
        concurrency: calls in flight at most, over all agents.
        send_timeout: seconds a beat may take before it is given up (the next one carries
            fresher lists); ``None`` waits as long as the client does.
        query_every: read ``state`` after every this many beats of an agent and apply it
            (:meth:`SimAgent.apply`); 0 never.
        on_beat: called after every beat attempt (:data:`BeatHook`).
        overlap: send an agent's beat when due even while its previous one is in flight (a
            load generator keeping its rate); by default an agent waits for its previous
            beat, as ``reaper agent`` does.

    A failed beat is counted (``errors``, ``last_error``) and skipped: an agent keeps going
    through an outage. Use as a context manager (sync or async) inside a running loop, or
    :meth:`start` and ``await`` :meth:`stop`.
    """

    def __init__(
        self,
        client: Client,
        task_queue: str,
        interval: float,
        *,
        concurrency: int = 64,
        send_timeout: float | None = None,
        query_every: int = 0,
        on_beat: BeatHook | None = None,
        overlap: bool = False,
    ) -> None:
        self.client, self.tq, self.interval = client, task_queue, interval
        self.send_timeout, self.query_every, self.on_beat = send_timeout, query_every, on_beat
        self.overlap = overlap
        self.agents: dict[str, SimAgent] = {}
        self.sem = asyncio.Semaphore(concurrency)
        self.sent = 0
        self.errors = 0
        self.last_error: str | None = None
        self.max_lateness = 0.0
        """Seconds by which a beat was sent later than due (this process cannot keep up)."""
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[Any]] = set()
        self._beats: dict[str, int] = {}
        self._querying: set[str] = set()

    def add(self, agents: Iterable[SimAgent], spread: float | None = None) -> None:
        """Add agents; their first beats are spread over ``spread`` seconds (default: now)."""
        agents = list(agents)
        now = time.monotonic()
        for i, a in enumerate(agents):
            a.next_due = now + (spread or 0.0) * i / max(len(agents), 1)
            self.agents[a.name] = a

    def kill(self, names: Iterable[str]) -> None:
        """Silence these agents for good (a beat in flight still lands)."""
        for n in names:
            self.agents[n].alive = False

    async def pause(self, name: str, timeout: float = 10.0) -> None:
        """Silence ``name``; returns once none of its beats is in flight.

        Raises:
            TimeoutError: a beat was still in flight after ``timeout`` seconds.
        """
        agent = self.agents[name]
        agent.alive = False
        deadline = time.monotonic() + timeout
        while agent.in_flight:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}'s beat still in flight after {timeout:g}s")
            await asyncio.sleep(0.01)

    def resume(self, name: str) -> None:
        """Let ``name`` beat again, at once."""
        agent = self.agents[name]
        agent.alive, agent.next_due = True, time.monotonic()

    def before_round(self) -> None:
        """Called before every look for due beats; a subclass adds, removes or wakes agents."""

    def start(self) -> None:
        """Start beating in the background."""
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop beating; returns once no call is in flight."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for t in list(self._inflight):
            t.cancel()
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    def __enter__(self) -> SimFleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        for t in list(self._inflight):
            t.cancel()

    async def __aenter__(self) -> SimFleet:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _loop(self) -> None:
        while True:
            self.before_round()
            now = time.monotonic()
            for a in list(self.agents.values()):
                if a.alive and a.next_due <= now and (self.overlap or not a.in_flight):
                    self.max_lateness = max(self.max_lateness, now - a.next_due)
                    a.next_due += self.interval
                    if a.next_due <= now:  # fell behind a whole interval: do not burst
                        a.next_due = now + self.interval
                    a.in_flight += 1
                    await self.sem.acquire()
                    self._spawn(self._send(a))
            await asyncio.sleep(TICK_S)

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._inflight.add(t)
        t.add_done_callback(self._inflight.discard)

    async def _send(self, a: SimAgent) -> None:
        sent, acked = time.time(), None
        beats = a.next_beats()
        limit = self.send_timeout + 0.5 if self.send_timeout is not None else None
        try:
            await asyncio.wait_for(a.send(self.client, self.tq, beats, self.send_timeout), limit)
            acked = time.time()
            self.sent += 1
        except Exception as exc:  # counted and shown; an agent keeps going
            self.errors += 1
            self.last_error = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        finally:
            a.in_flight -= 1
            self.sem.release()
        if self.on_beat is not None:
            self.on_beat(a, beats, sent, acked)
        n = self._beats[a.name] = self._beats.get(a.name, 0) + 1
        if self.query_every and n % self.query_every == 0 and a.name not in self._querying:
            self._querying.add(a.name)  # one query of an agent in flight at most
            self._spawn(self._query(a))

    async def _query(self, a: SimAgent) -> None:
        """Read ``state`` and apply it, unless the agent changed (boot, silence) meanwhile."""
        boot = a.boot_id
        try:
            view = await asyncio.wait_for(
                query_state(self.client, a.name, rpc_timeout=QUERY_TIMEOUT_S),
                QUERY_TIMEOUT_S + 0.5,
            )
        except Exception:
            return
        finally:
            self._querying.discard(a.name)
        if a.alive and a.boot_id == boot == view.boot_id:
            a.apply(view)
