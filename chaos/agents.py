"""Simulated agents speaking the agent protocol (CONTRACT.md §2, §5.1).

Each agent has a loop of its own: every ``HEARTBEAT_INTERVAL`` it signal-with-starts
``WorkerLiveness`` with its complete lists, and every other beat it queries ``state`` and
applies it as the reference agent does (an id in ``assignments`` is a task started, a
handle in ``orphans_by_kind`` is destroyed). Every beat goes to the ledger with the time
its send began and the time the server acknowledged it. The campaign changes an agent only
from its main loop (drop or hold a handle, go silent, reboot, retire, rejoin); the loops
draw no random numbers, so the campaign's choices depend on its seed alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from chaos.ledger import Beat, Ledger, Window
from chaos.settings import HEARTBEAT_S
from reaper.core.contract import StateView

KINDS = ("containers", "volumes", "tasks")
QUERY_EVERY = 3
"""An agent reads its ``state`` every this many beats (one query in flight at most)."""
QUERY_TIMEOUT_S = 5.0
"""A query not answered within this is given up (a loaded controller answers late)."""
SEND_TIMEOUT_S = 2 * HEARTBEAT_S
"""A beat not acknowledged within this is given up (the next one carries fresher lists);
as ``reaper agent``, which allows two intervals."""
RETIRE_TRY_S = 10.0
"""How long an agent keeps trying to deliver its ``retire`` (as ``reaper agent`` does)."""


@dataclass
class SimAgent:
    """One simulated agent; ``mode`` is ``active``, ``silent``, ``dead`` or ``retired``."""

    name: str
    boot: str = field(default_factory=lambda: f"boot-{uuid.uuid4().hex[:10]}")
    seq: int = 0
    held: dict[str, set[str]] = field(default_factory=lambda: {k: set() for k in KINDS})
    mode: str = "active"
    silent_until: float | None = None
    quiet: Window | None = None
    draining: bool = False
    held_at: dict[str, float] = field(default_factory=dict)
    """When the campaign last gave it each handle."""

    @property
    def beating(self) -> bool:
        return self.mode == "active"


class Agents:
    """The fleet of simulated agents on one Temporal client."""

    def __init__(self, client: Client, task_queue: str, ledger: Ledger) -> None:
        self.client, self.tq, self.ledger = client, task_queue, ledger
        self.agents: dict[str, SimAgent] = {}
        self.tasks: list[asyncio.Task[Any]] = []
        self.closing = False

    def names(self, *modes: str) -> list[str]:
        """Agents in one of ``modes`` (all when none given), sorted."""
        return sorted(n for n, a in self.agents.items() if not modes or a.mode in modes)

    def join(self, name: str) -> SimAgent:
        agent = SimAgent(name)
        self.agents[name] = agent
        self.tasks.append(asyncio.get_running_loop().create_task(self._loop(agent)))
        return agent

    async def close(self) -> None:
        self.closing = True
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    # ---- what the campaign does to an agent ------------------------------------------

    def hold(self, name: str, kind: str, handle: str) -> None:
        self.agents[name].held[kind].add(handle)
        self.agents[name].held_at[handle] = time.time()

    def drop(self, name: str, kind: str, handle: str) -> None:
        self.agents[name].held[kind].discard(handle)

    def silence(self, name: str, seconds: float | None) -> None:
        """Send nothing for ``seconds`` (``None``: until woken: the host is dead)."""
        a = self.agents[name]
        now = time.time()
        a.mode = "silent" if seconds is not None else "dead"
        a.silent_until = now + seconds if seconds is not None else None
        if a.quiet is None:
            a.quiet = self.ledger.silence(name, now)

    def wake(self, name: str) -> None:
        a = self.agents[name]
        a.mode, a.silent_until = "active", None
        if a.quiet is not None:
            a.quiet.end = time.time()
            a.quiet = None

    def reboot(self, name: str, wiped: bool) -> None:
        """A new boot id, ``seq`` from 1; ``wiped``: fresh local state (holds nothing)."""
        a = self.agents[name]
        a.boot, a.seq = f"boot-{uuid.uuid4().hex[:10]}", 0
        if wiped:
            a.held = {k: set() for k in KINDS}

    def rejoin(self, name: str) -> None:
        """A retired or dead host comes back as a fresh one: new boot, nothing held."""
        self.reboot(name, wiped=True)
        self.wake(name)

    def retire(self, name: str) -> None:
        """Planned shutdown: signal ``retire`` (in the background) and stop beating."""
        self.silence(name, None)
        self.agents[name].mode = "retired"
        self.ledger.retires.setdefault(name, []).append(time.time())
        self._background(self._signal(name, "retire", RETIRE_TRY_S))

    def drain(self, name: str, on: bool) -> None:
        self.agents[name].draining = on
        self._background(self._signal(name, "drain" if on else "undrain", RETIRE_TRY_S))

    # ---- the loops -------------------------------------------------------------------

    def _background(self, coro: Any) -> asyncio.Task[Any]:
        self.tasks = [t for t in self.tasks if not t.done()]
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task

    async def _loop(self, a: SimAgent) -> None:
        loop = asyncio.get_running_loop()
        next_at, n = loop.time(), 0
        query: asyncio.Task[Any] | None = None
        while not self.closing:
            if a.mode == "silent" and a.silent_until is not None and time.time() >= a.silent_until:
                self.wake(a.name)
            if a.beating:
                await self._beat(a)
                n += 1
                if n % QUERY_EVERY == 0 and (query is None or query.done()):
                    # Beside the beats, never delaying one (a loaded controller may take
                    # a while to answer).
                    query = self._background(self._query(a))
            next_at += HEARTBEAT_S
            delay = next_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                next_at = loop.time()

    async def _beat(self, a: SimAgent) -> None:
        a.seq += 1
        reports = {k: frozenset(a.held[k]) for k in KINDS}
        payload: dict[str, Any] = {
            "worker": a.name,
            "boot_id": a.boot,
            "seq": a.seq,
            "sent_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            **{k: sorted(v) for k, v in reports.items()},
        }
        sent, acked = time.time(), None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                self.client.start_workflow(
                    "WorkerLiveness",
                    {"worker": a.name},
                    id=f"liveness-{a.name}",
                    task_queue=self.tq,
                    start_signal="heartbeat",
                    start_signal_args=[payload],
                    rpc_timeout=timedelta(seconds=SEND_TIMEOUT_S),
                ),
                timeout=SEND_TIMEOUT_S + 0.5,
            )
            acked = time.time()
        self.ledger.beat(Beat(a.name, a.boot, a.seq, sent, acked, reports))

    async def _query(self, a: SimAgent) -> None:
        """Read ``state`` and apply it: start assignments, destroy orphans."""
        boot = a.boot
        try:
            view: StateView = await asyncio.wait_for(
                self.client.get_workflow_handle(f"liveness-{a.name}").query(
                    "state",
                    result_type=StateView,
                    rpc_timeout=timedelta(seconds=QUERY_TIMEOUT_S),
                ),
                timeout=QUERY_TIMEOUT_S + 0.5,
            )
        except Exception:
            return
        if not a.beating or a.boot != boot or view.boot_id != boot:
            return  # a view of an older boot, or the agent changed meanwhile
        for task_id in view.assignments:  # as ``reaper agent``: start what is not running
            if task_id not in a.held["tasks"]:
                self.hold(a.name, "tasks", task_id)
        for kind, handles in view.orphans_by_kind.items():
            if kind in a.held:
                a.held[kind].difference_update(handles)

    async def _signal(self, name: str, signal: str, within: float) -> None:
        """Deliver an operator or agent signal, retrying until ``within`` seconds passed."""
        give_up = time.monotonic() + within
        payload = {"reason": f"chaos {signal}", "actor": "agent"}
        while not self.closing and time.monotonic() < give_up:
            try:
                await self.client.get_workflow_handle(f"liveness-{name}").signal(
                    signal, payload, rpc_timeout=timedelta(seconds=1)
                )
                self.ledger.count(f"{signal} delivered")
                return
            except RPCError as exc:
                if exc.status is RPCStatusCode.NOT_FOUND:
                    return
            except Exception:
                pass
            await asyncio.sleep(0.5)
