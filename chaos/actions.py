"""Doing what the plan says: each :class:`chaos.plan.Action` handed to the agents, the
stand-in scheduler or the faults. Scheduler inserts and faults run in the background, so a
round never waits on a locked table or a server that is down.

A rotation's follow-up (an ``undrain`` some seconds later, or a ``retire`` once the host is
drained) is kept here and carried out by :meth:`Runner.follow_ups`, which the campaign calls
from its main loop before it plans a round: which follow-up comes is drawn from the seed,
when it comes follows the controller (how soon the host drains)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from chaos.agents import Agents
from chaos.faults import Faults
from chaos.ledger import Ledger
from chaos.plan import Action
from chaos.scheduler import Scheduler

RETIRE_WAIT_S = 60.0
"""How long after its deadline a rotation whose follow-up is ``retire`` may take to drain
before the follow-up is given up (faults may hold the migration back for long)."""
MIN_ACTIVE = 4
"""A follow-up retires a host only while more than this many agents beat (as the plan's
``retire``): the fleet keeps capacity for the replacements and stays out of disruption."""


@dataclass(frozen=True)
class FollowUp:
    """What follows a rotation of ``name`` (its boot ``boot``): ``undrain`` from ``due``
    on, or ``retire`` once its agent reads ``drained``, given up at ``until``."""

    name: str
    boot: str
    what: str
    due: float
    until: float


class Runner:
    """Runs actions; ``background`` holds the scheduler's inserts in flight, ``pending``
    the rotations' follow-ups."""

    def __init__(
        self, agents: Agents, scheduler: Scheduler, faults: Faults, ledger: Ledger
    ) -> None:
        self.agents, self.scheduler, self.faults, self.ledger = agents, scheduler, faults, ledger
        self.background: list[asyncio.Task[Any]] = []
        self.pending: list[FollowUp] = []

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

    # ---- host rotations (CONTRACT.md §6) -----------------------------------------------

    def _rotate(self, name: str, deadline: float, *then: object) -> None:
        """Drain ``name`` with ``migrate`` and ``deadline``; keep its follow-up, if any."""
        self.agents.rotate(name, deadline)
        self.pending = [f for f in self.pending if f.name != name]  # a new rotation's own
        now, boot = time.time(), self.agents.agents[name].boot
        if then and then[0] == "undrain":
            after = float(then[1])  # type: ignore[arg-type]
            self.pending.append(FollowUp(name, boot, "undrain", now + after, float("inf")))
        elif then and then[0] == "retire":
            until = now + deadline + RETIRE_WAIT_S
            self.pending.append(FollowUp(name, boot, "retire", now, until))

    def _rotate_skipped(self) -> None:
        """A rotation drawn when no host ran tasks: counted, nothing done."""

    def follow_ups(self) -> list[Action]:
        """Carry out the rotations' follow-ups that are due; returns them (as actions, for
        the round's line). An undrain is an operator's: it is sent when due whatever the
        host does, unless the host no longer drains or has retired. A retire waits while
        the host is silent (it drains on when it beats again) and is dropped once the host
        is no longer the one that was rotated (a new boot, undrained meanwhile) or
        ``until`` has passed."""
        done: list[Action] = []
        now = time.time()
        keep: list[FollowUp] = []
        for f in self.pending:
            a = self.agents.agents[f.name]
            if f.what == "undrain":
                overtaken = (
                    "undrained" if not a.draining
                    else "retired" if a.mode == "retired"
                    else None
                )  # fmt: skip
            else:
                overtaken = (
                    "rebooted" if a.boot != f.boot
                    else "undrained" if not a.draining
                    else "retired" if a.mode == "retired"
                    else ("drained, too few agents" if a.drained else "not drained in time")
                    if now > f.until
                    else None
                )  # fmt: skip
            if overtaken is not None:
                self.ledger.count(f"rotate {f.what} dropped: {overtaken}")
                continue
            if f.what == "undrain" and now >= f.due:
                done.append(Action("rotate-undrain", (f.name,)))
            elif (
                f.what == "retire"
                and a.beating
                and a.drained
                and len(self.agents.names("active")) > MIN_ACTIVE
            ):
                done.append(Action("rotate-retire", (f.name,)))
            else:
                keep.append(f)
        self.pending = keep
        for action in done:
            self.run(action)
        return done

    def _rotate_undrain(self, name: str) -> None:
        """An undrain in mid-migration or after it (§6.1: it ends the migration)."""
        self.agents.drain(name, False)

    def _rotate_retire(self, name: str) -> None:
        """The host is drained (§6.2): its autoscaler terminates it and retires it."""
        self.agents.retire(name)

    # ---- the scheduler -----------------------------------------------------------------

    def _handle(self, name: str, kind: str, handle: str, two_phase: bool) -> None:
        self._spawn(self.scheduler.handle(kind, name, handle, two_phase))

    def _phantom(self, name: str, kind: str, handle: str, creating: bool) -> None:
        self._spawn(self.scheduler.phantom(kind, name, handle, creating))

    def _service(self, name: str, count: int, max_surge: int = 1) -> None:
        self._spawn(self.scheduler.service(name, count, max_surge))

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
