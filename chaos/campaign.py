"""One campaign from start to its last line: the stack, the fleet, the rounds, the quiet
period, the final check.

1. Start the stack; wait until the replicas have migrated the schema; register
   ``AGENTS_AT_START`` agents with a few handles each and a service.
2. ``rounds`` rounds, each lasting a time drawn from ``ROUND_S``: the plan's actions for the
   round, while the checker reads Postgres every ``OBSERVE_EVERY_S`` and checks each step.
3. End every fault, wake every silent agent, undrain every drained one, and poll until
   nothing due is left undone (``chaos.settle``) or ``SETTLE_BOUND_S`` has passed.
4. Check every event again with all observations, scan the histories, print the summary
   (``chaos.summary``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from chaos import histories, rules, settle
from chaos.actions import Runner
from chaos.agents import Agents
from chaos.checker import Checker
from chaos.faults import Faults
from chaos.ledger import Ledger
from chaos.observe import Observations, observe
from chaos.plan import Fleet, plan_round
from chaos.rules import Violation
from chaos.scheduler import DB_ERRORS, Scheduler
from chaos.settings import (
    AGENTS_AT_START,
    CONTROLLER_ENV,
    OBSERVE_EVERY_S,
    PEER_VERSION,
    ROUND_S,
    SETTLE_BOUND_S,
)
from chaos.stack import Stack
from chaos.summary import summarize
from reaper.core import kinds
from reaper.core.policy import rollout

SETUP_TIMEOUT_S = 120.0
"""How long the stack and the first agents may take to come up (two busy cores)."""

SEEDED = tuple(
    k.report for k in kinds.HANDLE_ROWS for _ in range(2 if k is kinds.CONTAINERS else 1)
)
"""The rows the scheduler gives each agent at the start: two containers, one of every other
kind of handle row (``reaper.core.kinds``), in this order (the seeds of docs/chaos.md)."""


class Campaign:
    """A campaign of ``rounds`` rounds drawn from ``seed``."""

    def __init__(
        self, seed: int, rounds: int, keep: bool = False, peer_version: str = PEER_VERSION
    ) -> None:
        self.seed, self.rounds, self.keep = seed, rounds, keep
        self.peer_version = peer_version
        self.rng = random.Random(seed)
        self.t0 = time.monotonic()
        self.root = Path(tempfile.mkdtemp(prefix=f"reaper-chaos-{seed}-"))
        self.ledger = Ledger()
        self.obs = Observations()
        self.checker = Checker(self.ledger, self.obs, self.say)
        self.stack = Stack(self.root, {**CONTROLLER_ENV, "REAPER_PEER_VERSION": peer_version})
        self.faults = Faults(self.stack, self.ledger, self.say)
        self.observing = True
        self.completed = False
        """Set once the final check ran; a campaign that did not get there keeps its directory."""

    def say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:7.1f}s] {msg}", flush=True)

    async def run(self) -> int:
        """The whole campaign; returns the exit status (1 when a rule was broken)."""
        self.say(
            f"chaos seed {self.seed}, {self.rounds} rounds, peer version {self.peer_version},"
            f" stack in {self.root}"
        )
        logging.getLogger("asyncpg").setLevel(logging.CRITICAL)  # reconnects, expected here
        try:
            await self.stack.start()
            self.checker_pool = await self.stack.pool("chaos-checker", 300)
            self.pool = await self.stack.pool("chaos-scheduler", 1000)
            self.client = await self.stack.client()
            self.agents = Agents(self.client, self.stack.task_queue, self.ledger)
            self.scheduler = Scheduler(self.pool, self.agents, self.ledger)
            self.runner = Runner(self.agents, self.scheduler, self.faults, self.ledger)
            await self.setup()
            watcher = asyncio.get_running_loop().create_task(self.watch())
            await self.play()
            await self.quiet()
            self.observing = False
            await watcher
            await self.final()
            self.completed = True
        finally:
            await self.close()
        return self.summary()

    async def setup(self) -> None:
        await _until(self._schema, "the replicas migrating the schema")
        fleet = Fleet({}, {}, set(), set(), [])
        self.counter = fleet.counter
        for i in range(AGENTS_AT_START):
            self.agents.join(f"w{i}")
        await _until(self._registered, f"{AGENTS_AT_START} agents registered")
        for name in self.agents.names():
            for kind in SEEDED:
                handle = fleet.fresh(f"{kind[0]}-{name}")
                await self.scheduler.handle(kind, name, handle, two_phase=False)
        await self.scheduler.service(fleet.fresh("svc"), AGENTS_AT_START)
        self.say(f"{AGENTS_AT_START} agents registered; rounds begin")

    async def _schema(self) -> bool:
        try:
            await self.pool.fetchval("SELECT count(*) FROM reaper.fleet")
            return True
        except DB_ERRORS:
            return False

    async def _registered(self) -> bool:
        try:
            n = await self.pool.fetchval(
                "SELECT count(*) FROM reaper.workers WHERE state = 'running'"
            )
        except DB_ERRORS:
            return False
        return bool(n == AGENTS_AT_START)

    async def play(self) -> None:
        rotations = rollout.uses(rollout.ROTATING_HOSTS, self.peer_version)
        for r in range(1, self.rounds + 1):
            self.restart_exited()
            done = self.runner.follow_ups()
            fleet = Fleet(
                modes={n: a.mode for n, a in self.agents.agents.items()},
                held={
                    n: {k: sorted(v) for k, v in a.held.items()}
                    for n, a in self.agents.agents.items()
                },
                draining={n for n, a in self.agents.agents.items() if a.draining},
                busy=set(self.faults.busy),
                replicas_alive=[
                    c.alive() and f"replica-{i}" not in self.faults.busy
                    for i, c in enumerate(self.stack.replicas)
                ],
                counter=self.counter,
                retired_seen={
                    w for w, seen in self.obs.workers.items() if seen[-1].value[0] == "retired"
                },
                rotations=rotations,
                running=Counter(w for _, w, st in self.obs.tasks.values() if st == "running" and w),
            )
            actions = plan_round(self.rng, fleet)
            duration = self.rng.uniform(*ROUND_S)
            for a in actions:
                self.runner.run(a)
            self.runner._spawn(self.scheduler.complete_pending())
            self.say(f"round {r}: {'; '.join(map(str, [*done, *actions])) or '-'}")
            await asyncio.sleep(duration)

    def restart_exited(self) -> None:
        """A replica that exited on its own (no fault killed it) is a finding; restart it."""
        for i, c in enumerate(self.stack.replicas):
            if not c.alive() and f"replica-{i}" not in self.faults.busy and c.proc is not None:
                self.checker.add(
                    Violation(
                        "rule 8: controller exited",
                        f"replica {i}",
                        f"exit status {c.proc.returncode}; log tail:\n{self.stack.tail()}",
                        time.time(),
                    )
                )
                c.start()

    async def watch(self) -> None:
        """The checker's steps: read Postgres, check, every ``OBSERVE_EVERY_S``."""
        while self.observing:
            try:
                await observe(self.checker_pool, self.obs)
            except Exception as exc:  # a read the driver failed oddly: skip the step, say so
                self.say(f"checker read failed: {type(exc).__name__}: {exc}")
            self.checker.step()
            await asyncio.sleep(OBSERVE_EVERY_S)

    async def quiet(self) -> None:
        self.say("faults end; silent agents wake; drained agents undrain")
        await self.faults.end_all()
        self.runner.pending.clear()  # no rotation's follow-up after the faults end
        self.restart_exited()
        for name, a in self.agents.agents.items():
            if a.mode == "silent":
                self.agents.wake(name)
            if a.draining and a.mode == "active":
                self.agents.drain(name, False)
        await self.runner.drain()
        await self.scheduler.complete_pending()
        quiet = time.time()
        unmet: list[settle.Pending] = [settle.Pending("Postgres never read")]
        returns: dict[str, float] = {}
        while time.time() - quiet < SETTLE_BOUND_S:
            try:
                snap = await settle.snapshot(self.pool)
                unmet, returns = settle.unmet(snap, self.agents, self.ledger), settle.returns(snap)
            except DB_ERRORS as exc:
                unmet = [settle.Pending(f"Postgres unreadable: {exc}")]
            if not unmet:
                self.say(f"settled {time.time() - quiet:.1f}s after the faults ended")
                return
            await asyncio.sleep(OBSERVE_EVERY_S)
        now = time.time()
        for p in unmet:
            start = p.due_from(quiet, returns)
            if now - start > p.due_s:
                self.checker.add(
                    Violation(
                        "rule 8: due left undone",
                        p.what,
                        f"due {p.due_s:g}s after {rules.stamp(start)}; still undone "
                        f"{now - start:.1f}s later, {now - quiet:.1f}s after the faults ended",
                        now,
                    )
                )
            else:
                self.say(f"not settled, not due yet: {p.what} (clock from {rules.stamp(start)})")

    async def final(self) -> None:
        self.obs.max_event = 0  # read every event again
        await observe(self.checker_pool, self.obs)
        self.checker.final()
        self.scan = await histories.scan(self.client, self.stack.task_queue)
        for f in self.scan.failures:
            self.checker.add(Violation("workflow task failed", f.split(" ")[0], f, 0.0))
        if self.scan.failed:
            kept = self.root / "histories"
            kept.mkdir(exist_ok=True)
            for (wf_id, run_id), text in self.scan.failed.items():
                (kept / f"{wf_id}-{run_id[:8]}.json").write_text(text)
            self.say(f"histories of the failed runs in {kept}")

    async def close(self) -> None:
        for closer in (
            lambda: self.agents.close(),
            lambda: self.runner.drain(),
            lambda: self.faults.end_all(),
            lambda: self.pool.close(),
            lambda: self.checker_pool.close(),
        ):
            try:
                await asyncio.wait_for(closer(), 15)
            except (AttributeError, Exception):
                pass
        keep = self.keep or bool(self.checker.violations) or not self.completed
        self.stack.close(keep=keep)
        if keep:
            self.say(f"kept {self.root} (logs, Postgres data, temporal.db)")

    def summary(self) -> int:
        violations = list(self.checker.violations.values())
        scan = getattr(self, "scan", None)
        return summarize(
            self.say, self.rounds, self.peer_version, self.ledger, self.obs, violations, scan
        )


async def _until(check: Any, what: str) -> None:
    """Poll ``check()`` until true, or fail after ``SETUP_TIMEOUT_S``."""
    deadline = time.monotonic() + SETUP_TIMEOUT_S
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {SETUP_TIMEOUT_S:g}s waiting for {what}")
        await asyncio.sleep(0.2)
