"""Doing what the plan says: each :class:`chaos.plan.Action` handed to the agents, the
stand-in scheduler or the faults. Scheduler inserts and faults run in the background, so a
round never waits on a locked table or a server that is down."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from chaos.agents import Agents
from chaos.faults import Faults
from chaos.ledger import Ledger
from chaos.plan import Action
from chaos.scheduler import Scheduler


class Runner:
    """Runs actions; ``background`` holds the scheduler's inserts in flight."""

    def __init__(
        self, agents: Agents, scheduler: Scheduler, faults: Faults, ledger: Ledger
    ) -> None:
        self.agents, self.scheduler, self.faults, self.ledger = agents, scheduler, faults, ledger
        self.background: list[asyncio.Task[Any]] = []

    def run(self, action: Action) -> None:
        self.ledger.count(action.what)
        getattr(self, "_" + action.what.replace("-", "_"))(*action.args)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.background = [t for t in self.background if not t.done()]
        self.background.append(asyncio.get_running_loop().create_task(coro))

    async def drain(self) -> None:
        """Wait for the scheduler's inserts in flight."""
        await asyncio.gather(*self.background, return_exceptions=True)

    # ---- agents ------------------------------------------------------------------------

    def _join(self, name: str) -> None:
        self.agents.join(name)

    def _partition(self, names: tuple[str, ...], seconds: float) -> None:
        for n in names:
            self.agents.silence(n, seconds)

    def _rejoin(self, name: str) -> None:
        self.agents.rejoin(name)

    def _drop(self, name: str, kind: str, handle: str) -> None:
        self.agents.drop(name, kind, handle)

    def _flap(self, name: str, kind: str, handle: str, back_after: float) -> None:
        """Drop a handle and hold it again before the TTL: it must survive."""
        agent = self.agents.agents[name]
        boot = agent.boot
        self.agents.drop(name, kind, handle)

        def back() -> None:
            if agent.boot == boot and agent.beating:
                self.agents.hold(name, kind, handle)

        asyncio.get_running_loop().call_later(back_after, back)

    def _silence(self, name: str, seconds: float) -> None:
        self.agents.silence(name, seconds)

    def _die(self, name: str) -> None:
        self.agents.silence(name, None)

    def _reboot(self, name: str, wiped: bool) -> None:
        self.agents.reboot(name, wiped)

    def _stray(self, name: str, kind: str, handle: str) -> None:
        self.agents.hold(name, kind, handle)  # no row: an orphan after the TTL

    def _drain(self, name: str, on: bool) -> None:
        self.agents.drain(name, on)

    def _retire(self, name: str) -> None:
        self.agents.retire(name)

    # ---- the scheduler -----------------------------------------------------------------

    def _handle(self, name: str, kind: str, handle: str, two_phase: bool) -> None:
        self._spawn(self.scheduler.handle(kind, name, handle, two_phase))

    def _phantom(self, name: str, kind: str, handle: str, creating: bool) -> None:
        self._spawn(self.scheduler.phantom(kind, name, handle, creating))

    def _service(self, name: str, count: int) -> None:
        self._spawn(self.scheduler.service(name, count))

    # ---- faults ------------------------------------------------------------------------

    def _kill(self, i: int, down_s: float) -> None:
        self.faults.start(f"replica-{i}", self.faults.kill_replica(i, down_s))

    def _kill_both(self, down_s: float) -> None:
        for i in range(len(self.faults.stack.replicas)):
            self._kill(i, down_s)

    def _temporal(self, down_s: float) -> None:
        self.faults.start("temporal", self.faults.restart_temporal(down_s))

    def _postgres(self, mode: str, down_s: float) -> None:
        self.faults.start("postgres", self.faults.restart_postgres(mode, down_s))

    def _lock(self, table: str, hold_s: float) -> None:
        self.faults.start("lock", self.faults.lock_table(table, hold_s))

    def _sleep(self, target: str, hold_s: float) -> None:
        self.faults.start("lock", self.faults.sleep_locked(target, hold_s))

    def _terminate(self) -> None:
        self.faults.start("terminate", self.faults.terminate())
