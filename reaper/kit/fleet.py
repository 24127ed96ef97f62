"""Simulated agents beating in the background: :class:`SimFleet` beats every agent
(:class:`reaper.kit.agents.SimAgent`) every interval (phases spread, calls bounded, one beat
of an agent in flight unless told otherwise), can silence, pause and resume one, and can read
``state`` and apply it as the reference agent does."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from reaper.kit.agents import SimAgent, query_state

if TYPE_CHECKING:
    from temporalio.client import Client

TICK_S = 0.02
"""How often :class:`SimFleet` looks for agents whose beat is due, in seconds."""
QUERY_TIMEOUT_S = 5.0
"""A ``state`` query not answered within this is given up (a loaded controller answers
late), in seconds."""


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
        workflow: beat a baseline workflow of this type instead of reaper's liveness
            (:func:`reaper.kit.agents.send_heartbeat`).

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
        workflow: str | None = None,
    ) -> None:
        self.client, self.tq, self.interval = client, task_queue, interval
        self.send_timeout, self.query_every, self.on_beat = send_timeout, query_every, on_beat
        self.overlap, self.workflow = overlap, workflow
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
            await asyncio.wait_for(
                a.send(self.client, self.tq, beats, self.send_timeout, self.workflow), limit
            )
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
