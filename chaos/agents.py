"""Simulated agents speaking the agent protocol (CONTRACT.md §2, §5.1).

The kit's simulated agents (:mod:`reaper.kit.fleet`): every ``HEARTBEAT_INTERVAL`` each
signal-with-starts ``WorkerLiveness`` with its complete lists, and every third beat it
queries ``state`` and applies it as the reference agent does (an id in ``assignments`` is a
task started, a handle in ``orphans_by_kind`` is destroyed). Every beat goes to the ledger
with the time its send began and the time the server acknowledged it. The campaign changes
an agent only from its main loop (drop or hold a handle, go silent, reboot, retire,
rejoin); the loops draw no random numbers, so the campaign's choices depend on its seed
alone.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from chaos.ledger import Beat, Command, Ledger, Window
from chaos.settings import HEARTBEAT_S
from reaper.core.contract import KINDS, StateView, liveness_id
from reaper.kit.agents import SimAgent
from reaper.kit.fleet import SimFleet
from workflows.operator import STARTING

QUERY_EVERY = 3
"""An agent reads its ``state`` every this many beats (one query in flight at most)."""
SEND_TIMEOUT_S = 2 * HEARTBEAT_S
"""A beat not acknowledged within this is given up (the next one carries fresher lists);
as ``reaper agent``, which allows two intervals."""
RETIRE_TRY_S = 10.0
"""How long an agent keeps trying to deliver its ``retire`` (as ``reaper agent`` does)."""


@dataclass(eq=False)
class ChaosAgent(SimAgent):
    """One simulated agent; ``mode`` is ``active``, ``silent``, ``dead`` or ``retired``
    (it beats only while ``active``: ``alive`` follows ``mode``)."""

    held: dict[str, set[str]] = field(default_factory=lambda: {k: set() for k in KINDS})
    mode: str = "active"
    silent_until: float | None = None
    quiet: Window | None = None
    draining: bool = False
    drained: bool = False
    """What its latest ``state`` read said of ``drained`` (CONTRACT.md §6.2): what an
    autoscaler waits for before it terminates the host."""
    held_at: dict[str, float] = field(default_factory=dict)
    """When the campaign last gave it each handle."""

    @property
    def boot(self) -> str:
        return self.boot_id

    @property
    def beating(self) -> bool:
        return self.mode == "active"

    def set_mode(self, mode: str) -> None:
        self.mode, self.alive = mode, mode == "active"

    def hold(self, kind: str, handle: str) -> None:
        self.held[kind].add(handle)
        self.held_at[handle] = time.time()

    def report(self) -> Mapping[str, list[str]]:
        return {k: sorted(self.held[k]) for k in KINDS}

    def apply(self, view: StateView) -> None:
        """As ``reaper agent``: start what is assigned and not running, destroy orphans."""
        for task_id in view.assignments:
            if task_id not in self.held["tasks"]:
                self.hold("tasks", task_id)
        for kind, handles in view.orphans_by_kind.items():
            if kind in self.held:
                self.held[kind].difference_update(handles)
        self.drained = view.drained


class Agents(SimFleet):
    """The fleet of simulated agents on one Temporal client (the kit's :class:`SimFleet`:
    a beat every ``HEARTBEAT_S``, ``state`` read and applied every ``QUERY_EVERY`` beats);
    every beat goes to the ledger with the time its send began and the time the server
    acknowledged it."""

    agents: dict[str, ChaosAgent]  # type: ignore[assignment]

    def __init__(self, client: Client, task_queue: str, ledger: Ledger) -> None:
        super().__init__(
            client,
            task_queue,
            HEARTBEAT_S,
            send_timeout=SEND_TIMEOUT_S,
            query_every=QUERY_EVERY,
            on_beat=self._record,
        )
        self.ledger = ledger
        self.tasks: list[asyncio.Task[Any]] = []
        self.commanding: dict[str, asyncio.Task[Any]] = {}
        """Per worker: its latest drain, undrain or rotation being delivered."""
        self.closing = False
        self.start()

    def names(self, *modes: str) -> list[str]:
        """Agents in one of ``modes`` (all when none given), sorted."""
        return sorted(n for n, a in self.agents.items() if not modes or a.mode in modes)

    def join(self, name: str) -> ChaosAgent:
        agent = ChaosAgent(name)
        self.add([agent])
        return agent

    async def close(self) -> None:
        self.closing = True
        await self.stop()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def before_round(self) -> None:
        now = time.time()
        for a in self.agents.values():
            if a.mode == "silent" and a.silent_until is not None and now >= a.silent_until:
                self.wake(a.name)

    def _record(
        self, a: SimAgent, beats: list[dict[str, Any]], sent: float, acked: float | None
    ) -> None:
        last = beats[-1]
        reports = {k: frozenset(last.get(k, ())) for k in KINDS}
        self.ledger.beat(Beat(a.name, a.boot_id, int(last["seq"]), sent, acked, reports))

    # ---- what the campaign does to an agent ------------------------------------------

    def hold(self, name: str, kind: str, handle: str) -> None:
        self.agents[name].hold(kind, handle)

    def drop(self, name: str, kind: str, handle: str) -> None:
        self.agents[name].held[kind].discard(handle)

    def silence(self, name: str, seconds: float | None) -> None:
        """Send nothing for ``seconds`` (``None``: until woken: the host is dead). A retired
        or dead host stays as it is: a silence that ends would wake its old boot, and such a
        host comes back only by :meth:`rejoin`, as a new boot (CONTRACT.md §5.1)."""
        a = self.agents[name]
        if seconds is not None and a.mode in ("retired", "dead"):
            return
        now = time.time()
        a.set_mode("silent" if seconds is not None else "dead")
        a.silent_until = now + seconds if seconds is not None else None
        if a.quiet is None:
            a.quiet = self.ledger.silence(name, now)

    def wake(self, name: str) -> None:
        a = self.agents[name]
        a.set_mode("active")
        a.silent_until = None
        if a.quiet is not None:
            a.quiet.end = time.time()
            a.quiet = None

    def reboot(self, name: str, wiped: bool) -> None:
        """A new boot id, ``seq`` from 0; ``wiped``: fresh local state (holds nothing)."""
        a = self.agents[name]
        a.reboot()
        a.drained = False
        if wiped:
            a.held = {k: set() for k in KINDS}

    def rejoin(self, name: str) -> None:
        """A retired or dead host comes back as a fresh one: new boot, nothing held."""
        self.reboot(name, wiped=True)
        self.wake(name)

    def retire(self, name: str) -> None:
        """Planned shutdown: signal ``retire`` (in the background) and stop beating."""
        self.silence(name, None)
        self.agents[name].set_mode("retired")
        self.ledger.retires.setdefault(name, []).append(time.time())
        self._background(self._signal(name, "retire", RETIRE_TRY_S))

    def drain(self, name: str, on: bool) -> None:
        """Signal ``drain`` (v1: nothing new placed) or ``undrain`` (which also ends a
        migration, §6.1); a command still being retried for the worker is given up."""
        a = self.agents[name]
        a.draining, a.drained = on, False
        what = "drain" if on else "undrain"
        self._command(name, self._signal(name, what, RETIRE_TRY_S, Command(what, 0.0)))

    def rotate(self, name: str, deadline: float) -> None:
        """A host rotation (CONTRACT.md §6.1): the ``drain`` update with ``migrate`` and
        ``deadline`` seconds, retried until ``RETIRE_TRY_S`` has passed (under one update
        id, so an attempt that got through and one after it are one drain); a command still
        being retried for the worker is given up."""
        a = self.agents[name]
        a.draining, a.drained = True, False
        self._command(name, self._rotate(name, deadline, RETIRE_TRY_S))

    # ---- operator and agent signals --------------------------------------------------

    def _background(self, coro: Any) -> asyncio.Task[Any]:
        self.tasks = [t for t in self.tasks if not t.done()]
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task

    def _command(self, name: str, coro: Any) -> None:
        """Run a drain, undrain or rotation of ``name`` in the background, giving up the
        one before it if it is still retried: its late delivery would undo this one."""
        previous = self.commanding.get(name)
        if previous is not None and not previous.done():
            previous.cancel()
        self.commanding[name] = self._background(coro)

    async def _signal(
        self, name: str, signal: str, within: float, record: Command | None = None
    ) -> None:
        """Deliver an operator or agent signal, retrying until ``within`` seconds passed;
        each attempt goes to the ledger as ``record`` at its time, if given."""
        give_up = time.monotonic() + within
        payload = {"reason": f"chaos {signal}", "actor": "agent"}
        while not self.closing and time.monotonic() < give_up:
            if record is not None:
                self.ledger.command(name, replace(record, sent=time.time()))
            try:
                await self.client.get_workflow_handle(liveness_id(name)).signal(
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

    async def _rotate(self, name: str, deadline: float, within: float) -> None:
        """The ``drain`` update with ``migrate`` (CONTRACT.md §6.3), retried while no
        controller answers or the liveness starts a run; a refusal ends it (counted by its
        reason's first words)."""
        give_up = time.monotonic() + within
        payload = {
            "reason": "chaos rotate",
            "actor": "chaos",
            "migrate": True,
            "deadline": f"{round(deadline * 1000)}ms",
        }
        update_id = f"chaos-rotate-{uuid.uuid4().hex[:10]}"
        while not self.closing and time.monotonic() < give_up:
            self.ledger.command(name, Command("rotate", time.time(), deadline))
            try:
                answer = await self.client.get_workflow_handle(liveness_id(name)).execute_update(
                    "drain", payload, id=update_id, rpc_timeout=timedelta(seconds=2)
                )
                migrating = isinstance(answer, dict) and answer.get("migrating")
                self.ledger.count("rotate migrating" if migrating else "rotate answered")
                return
            except WorkflowUpdateFailedError as exc:
                why = str(exc.cause or exc)
                if STARTING not in why:
                    self.ledger.count(f"rotate refused: {why[:40]}")
                    return
            except RPCError as exc:
                if exc.status is RPCStatusCode.NOT_FOUND:
                    return
            except Exception:
                pass
            await asyncio.sleep(0.5)
