"""A fleet of simulated agents driving real workflows on the time-skipping server.

Time moves only when a test says so (``advance``); after each beat the harness waits,
with a real-time deadline, until the liveness and its collector have handled it, so a test
observes the effect of exactly the beats it sent.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
from temporalio.api.testservice.v1 import UnlockTimeSkippingRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from reaper.core.contract import StateView
from reaper.core.models import Timings
from reaper.core.signing import Ed25519PrivateKey, sign_heartbeat
from tests.support.controller import Activations, controller, make_settings
from tests.support.heartbeats import query_state, reports_reconciled, send
from tests.support.polling import eventually
from workflows.common import collector_id, fleet_monitor_id, liveness_id, reap_id
from workflows.fleet import FleetMonitor

CHUNK = 5.0
"""Server seconds of the longest single sleep in :meth:`Fleet.advance`; a sleep of that
length that takes 80 % of it in wall time means the server stopped skipping time."""


class Fleet:
    """Simulated agents: ``beat`` sends a heartbeat and waits until it has been handled."""

    def __init__(
        self,
        env: WorkflowEnvironment,
        pool: asyncpg.Pool,
        task_queue: str,
        activations: Activations | None = None,
    ) -> None:
        self.env = env
        self.activations = activations
        """The controller's workflow activations: :meth:`settle` asks again after each."""
        self.client: Client = env.client
        self.pool = pool
        self.tq = task_queue
        self.seq: dict[str, int] = {}
        self.boot: dict[str, str] = {}
        self.suffix = uuid.uuid4().hex[:6]
        self.names: list[str] = []
        self.keys: dict[str, Ed25519PrivateKey] = {}
        """Workers whose beats are signed (CONTRACT.md §5.2), by their agent's key."""
        self.extra_ids: list[str] = []
        """Other workflows of this test, terminated with it (the fleet monitor)."""

    def name(self, base: str) -> str:
        """A worker name unique to this test (workflow ids outlive a test on the server)."""
        name = f"{base}-{self.suffix}"
        self.names.append(name)
        return name

    async def close(self) -> None:
        """Terminate this test's workflows: the time-skipping server skips no time while a
        workflow task waits on a queue that no worker polls any more."""
        for wid in self.workflow_ids():
            try:
                await self.client.get_workflow_handle(wid).terminate("test over")
            except RPCError:
                pass

    def workflow_ids(self) -> list[str]:
        """Every workflow this test may have started: its workers' livenesses, collectors
        and first reaps, and :attr:`extra_ids`."""
        ids = [wid for n in self.names for wid in (liveness_id(n), collector_id(n))]
        ids += [reap_id(n, i) for n in self.names for i in range(1, 4)]
        return [*ids, *self.extra_ids]

    async def busy(self) -> bool:
        """Whether a workflow of this test has an activity or a workflow task pending: the
        time-skipping server then holds its clock for them, and a sleep that took wall time
        is no leaked lock. Giving the lock back then let the server skip time under a
        running activity: on a loaded machine (a clean clone's CI beside other work) the
        fleet timelines saw a worker that had just beaten turn ``lost``."""
        for wid in self.workflow_ids():
            try:
                d = (await self.client.get_workflow_handle(wid).describe()).raw_description
            except RPCError:
                continue
            if d.pending_activities or d.HasField("pending_workflow_task"):
                return True
        return False

    def reboot(self, worker: str) -> str:
        """The agent restarts with fresh local state: a new boot id, seq from 0."""
        self.boot[worker] = f"boot-{uuid.uuid4().hex[:8]}"
        self.seq[worker] = -1
        return self.boot[worker]

    async def beat(self, worker: str, **reports: Any) -> StateView:
        if worker not in self.boot:
            self.reboot(worker)
        self.seq[worker] += 1
        seq, boot = self.seq[worker], self.boot[worker]
        payload = {
            "worker": worker,
            "boot_id": boot,
            "seq": seq,
            "sent_at": "2026-11-30T10:00:00Z",
            **reports,
        }
        if worker in self.keys:
            payload = sign_heartbeat(payload, self.keys[worker])
        await send(self.client, self.tq, payload)
        return await self.settle(worker, lambda s: s.boot_id == boot and s.last_seq == seq)

    async def raw(self, worker: str, payload: Any) -> StateView:
        """Send any payload as a heartbeat; wait until the liveness has seen it."""
        before = await self._state_or_none(worker)
        await send(self.client, self.tq, payload, worker=worker)
        rejected = before.rejected if before else 0
        ignored = before.ignored if before else 0
        seq = before.last_seq if before else None
        return await self.settle(
            worker, lambda s: s.rejected > rejected or s.ignored > ignored or s.last_seq != seq
        )

    async def took(self, worker: str, beat: dict[str, Any]) -> None:
        """Send ``beat`` and wait until the liveness took it (its ``seq`` is the last): its
        reports may still be staging or reconciling, which :meth:`raw` waits for too."""
        await send(self.client, self.tq, beat, worker=worker)
        await eventually(
            lambda: self.state(worker), lambda s: s.last_seq == beat["seq"], what="beat taken"
        )

    @contextlib.asynccontextmanager
    async def staging_held(self, worker: str, kind: str = "containers") -> AsyncIterator[None]:
        """Hold the lock each ``stage_chunk`` of ``worker``'s ``kind`` takes after its insert
        (``activities/staging.py``) for the body: staged chunks wait, later ones queue."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))", worker, kind
            )
            yield

    async def staged_chunks(self, worker: str) -> list[tuple[str, int]]:
        """``(report_id, index)`` of every ``stage_chunk`` activity ``worker``'s liveness (its
        current run) scheduled, in order."""
        found = []
        handle = self.client.get_workflow_handle(liveness_id(worker))
        async for ev in handle.fetch_history_events():
            if ev.HasField("activity_task_scheduled_event_attributes"):
                attrs = ev.activity_task_scheduled_event_attributes
                if attrs.activity_type.name == "stage_chunk":
                    data = json.loads(attrs.input.payloads[0].data)
                    found.append((data["report_id"], data["index"]))
        return found

    async def settle(
        self, worker: str, handled: Callable[[StateView], bool] = lambda _: True
    ) -> StateView:
        """Wait until ``handled`` holds for ``worker``'s `state` (a beat seen) and every report
        its liveness forwarded has been reconciled: one poll for both (each query costs a
        workflow task), asked again after each of the controller's workflow activations
        (without them, first after 5 ms: on the time-skipping server a beat is handled within
        milliseconds)."""
        return await reports_reconciled(
            self.client, worker, handled=handled, first=0.005, changes=self.activations
        )

    async def _state_or_none(self, worker: str) -> StateView | None:
        try:
            return await query_state(self.client, worker)
        except RPCError:
            return None

    async def advance(
        self, seconds: float, beating: dict[str, dict[str, Any]] | None = None, step: float = 10.0
    ) -> None:
        """Let ``seconds`` pass; workers in ``beating`` beat every ``step`` with those reports.

        Time passes in sleeps of at most :data:`CHUNK` server seconds, so that a leaked
        time-skipping lock (below) costs at most that much wall time, not a whole step."""
        left = seconds
        while left > 0:
            dt = min(step, left)
            slept = 0.0
            while slept < dt:
                chunk = min(CHUNK, dt - slept)
                started = time.monotonic()
                await self.env.sleep(chunk)
                if (
                    chunk >= CHUNK
                    and time.monotonic() - started > 0.8 * chunk
                    and not await self.busy()
                ):
                    # The test server sometimes stops skipping time for good after a liveness
                    # completes on retirement, as if a lock leaked (tests/workflows/
                    # test_fleet_timelines.py LEAKED_LOCK); one unlock restores it, and an
                    # unlock with no lock held is refused, so this cannot unbalance the count;
                    # a lock held for pending work is not given back (:meth:`busy`).
                    with contextlib.suppress(RPCError):
                        await self.env.client.test_service.unlock_time_skipping(
                            UnlockTimeSkippingRequest()
                        )
                slept += chunk
            left -= dt
            for worker, reports in (beating or {}).items():
                await self.beat(worker, **reports)

    async def state(self, worker: str) -> StateView:
        return await query_state(self.client, worker)

    async def retired(self, worker: str) -> None:
        """Wait until ``worker`` is retired in Postgres and its liveness has completed. The
        row says ``retired`` as soon as the retirement activity commits; the run ends after
        its collector stops, and until then a new boot's beat still reaches the retiring run
        (and is ignored, or refused by the old pin): a host reinstalled after retirement
        beats once the run has ended."""

        async def done() -> tuple[str | None, WorkflowExecutionStatus | None]:
            state = await self.pool.fetchval(
                "SELECT state FROM reaper.workers WHERE name = $1", worker
            )
            desc = await self.client.get_workflow_handle(liveness_id(worker)).describe()
            return state, desc.status

        await eventually(
            done,
            lambda t: t == ("retired", WorkflowExecutionStatus.COMPLETED),
            what=f"{worker} retired",
        )


@contextlib.asynccontextmanager
async def fleet_with(
    env: WorkflowEnvironment, pool: asyncpg.Pool, *, monitor: bool = False, **overrides: object
) -> AsyncIterator[Fleet]:
    """A controller with ``make_settings(**overrides)`` on its own task queue, plus simulated
    agents; with ``monitor``, also its fleet monitor (owed work, strays), as worker.py starts
    it."""
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    settings = make_settings(**overrides)
    activations = Activations()
    async with controller(env.client, pool, settings, tq, activations=activations):
        f = Fleet(env, pool, tq, activations)
        try:
            if monitor:
                timings = Timings.of(settings)
                await env.client.start_workflow(
                    FleetMonitor.run, timings, id=fleet_monitor_id(tq), task_queue=tq
                )
                f.extra_ids.append(fleet_monitor_id(tq))
            yield f
        finally:
            await f.close()
