"""How long this controller process has reached Temporal and Postgres without a break: the
evidence that tells a late look at a worker's deadline caused by the controller's own queue
(both up, every beat accepted and applied before the timer: the silence is evidence) from
one caused by an outage (Temporal down: beats refused; Postgres down: the liveness's work
held; the outage grace, ``policy.liveness.outage_grace``, and the outage tests'
promise: a worker that beats again within STALL_AFTER of a recovery is not reaped).

A workflow cannot tell the two apart: it sees when its task started, not when its timer
fired. The process can: it asks Temporal's health service, on the connection its worker
polls with, and Postgres (``SELECT 1``) every ``interval`` seconds, and a watch runs from
the first look at which both answer, after a failure or the start, until the next failure.
The liveness asks it by a local activity (``controller_watched_for``), recorded in history
like any other answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta

import asyncpg
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

log = logging.getLogger("reaper.watch")

WATCH_INTERVAL_S = 1.0
"""How often the health service is asked (seconds): an outage shorter than this may go
unseen, and refuses at most the beats of that second."""

CHECK_TIMEOUT_S = 5.0
"""How long one health check may take (seconds). A check that times out proves nothing by
itself: a process that was stopped or starved of CPU finds its check's deadline passed
before it reads the answer that came meanwhile. Two in a row end the watch (a server that
accepts connections and answers nothing refuses beats too)."""


def _timed_out(exc: BaseException) -> bool:
    """Whether a check failed by its own deadline, not by an answer or a refused connection."""
    if isinstance(exc, TimeoutError):
        return True
    return isinstance(exc, RPCError) and exc.status is RPCStatusCode.DEADLINE_EXCEEDED


class OutageWatch:
    """Whether, and for how long, this process has reached Temporal and Postgres without a
    break.

    Args:
        checks: the health checks of one look, run together: each returns truthy when its
            service answers, falsy or raises when it does not (an exception is a failure,
            logged once per break).
        interval: seconds between checks (:data:`WATCH_INTERVAL_S`).
        clock: a monotonic clock in seconds (``time.monotonic``): durations only, immune to
            the wall clock's steps.
    """

    def __init__(
        self,
        checks: Sequence[Callable[[], Awaitable[object]]],
        interval: float = WATCH_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._checks = tuple(checks)
        self._interval = interval
        self._clock = clock
        self._since: float | None = None
        self._timed_out = False

    @classmethod
    def of(
        cls, client: Client, pool: asyncpg.Pool, interval: float = WATCH_INTERVAL_S
    ) -> OutageWatch:
        """A watch of ``client``'s connection (the worker's own), by the gRPC health service,
        and of ``pool``'s Postgres."""

        async def temporal() -> bool:
            return await client.service_client.check_health(
                timeout=timedelta(seconds=CHECK_TIMEOUT_S)
            )

        async def postgres() -> object:
            return await asyncio.wait_for(pool.fetchval("SELECT 1"), CHECK_TIMEOUT_S)

        return cls((temporal, postgres), interval)

    def watched_for(self) -> float:
        """Seconds since the current watch began (``0.0`` when Temporal is not reached now,
        or was never reached by this process)."""
        return 0.0 if self._since is None else max(0.0, self._clock() - self._since)

    async def look(self) -> None:
        """One health check: a success starts a watch if none runs; a failure ends it, but a
        check that timed out ends it only when the one before timed out too
        (:data:`CHECK_TIMEOUT_S`)."""
        answers = await asyncio.gather(*(c() for c in self._checks), return_exceptions=True)
        failed = [a for a in answers if isinstance(a, BaseException)]
        if failed and all(_timed_out(a) for a in failed) and not self._timed_out:
            self._timed_out = True  # inconclusive once (CHECK_TIMEOUT_S)
            return
        self._timed_out = False
        up = not failed and all(answers)
        if not up and self._since is not None:
            log.warning("Temporal or Postgres not reached (%s): the watch starts again", failed)
        if not up:
            self._since = None
        elif self._since is None:
            self._since = self._clock()

    async def run(self) -> None:
        """Check every ``interval`` seconds until cancelled."""
        while True:
            await self.look()
            await asyncio.sleep(self._interval)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[OutageWatch]:
        """Run the checks in a background task for the duration of the block."""
        task = asyncio.create_task(self.run(), name="temporal-watch")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
