"""How the reference agent connects to Temporal: one quiet attempt at a time.

The agent's own loop is the retry (a beat that cannot get through is replaced by the next,
fresher one), so connections and calls here retry only briefly, and the SDK's core logs only
errors: the agent logs an outage once itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.service import RetryConfig

from reaper.core.contract import DEFAULT_ADDRESS, STATE_QUERY, StateView


async def query_state(handle: WorkflowHandle[Any, Any], seconds: float) -> StateView:
    """The liveness's ``state`` (CONTRACT.md §2) within ``seconds``.

    The deadline is the caller's own (``asyncio.wait_for``), not only the RPC's: the SDK
    client asks again past ``rpc_timeout`` while the server says the workflow is busy
    ("consistent query buffer is full": a new worker's first task in flight); a 5 s query
    took 15 s so (breaker, 2026-12-04).

    Raises:
        TimeoutError: no answer within ``seconds``.
        temporalio.service.RPCError: the server refused the query.
    """
    rpc = timedelta(seconds=seconds)
    query = handle.query(STATE_QUERY, result_type=StateView, rpc_timeout=rpc)
    return await asyncio.wait_for(query, seconds)


StateQuery = Callable[[WorkflowHandle[Any, Any], float], Coroutine[Any, Any, StateView]]
"""Asks a liveness's ``state`` within a deadline in seconds: :func:`query_state`'s shape."""


class StateAsker:
    """The agent's ``state`` query, one at a time and carried across beats.

    A beat waits for the answer only as long as its interval has left, so that the next beat
    goes on time; an answer that comes later is not lost: the query keeps running, with a
    deadline of its own, and the next beat takes its answer. A busy controller answers in
    more than one interval; abandoning each query at the interval left the agent with no
    answer at all under load, and so without its assignments and orphans (a fresh clone's
    ``make test``, 2026-12-04: the demo's orphan step, heartbeat 1 s).

    An answer, or a failure, that has waited longer than ``fresh`` seconds for a beat to take
    it is dropped and the query asked again: while beats fail, one may wait for minutes, and
    acting on it would start or stop work on a view that old (breaker, 2026-12-05: a 17 s
    old view applied at heartbeat 1 s). A failure nobody waits for is never left for asyncio
    to report, and :meth:`close` never raises.
    """

    def __init__(
        self, query: StateQuery | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``query``: how to ask (:func:`query_state` unless given); ``clock``: seconds."""
        self._query = query or query_state
        self._clock = clock
        self._task: asyncio.Task[StateView] | None = None
        self._done_at = 0.0

    async def ask(
        self, handle: WorkflowHandle[Any, Any], wait: float, deadline: float, fresh: float
    ) -> StateView | None:
        """The answer if it is in within ``wait`` seconds, else ``None`` (still asked).

        Args:
            handle: the worker's liveness (used if a new query starts).
            wait: seconds this call waits.
            deadline: seconds a new query may take in all (:func:`query_state`).
            fresh: seconds a finished query's answer or failure stays usable.

        Raises:
            TimeoutError, temporalio.service.RPCError: the query failed (as
                :func:`query_state`) within ``fresh`` seconds; the next call asks again.
        """
        task = self._task
        if task is not None and task.done() and self._clock() - self._done_at > fresh:
            task = None
        if task is None:
            task = self._task = asyncio.create_task(self._query(handle, deadline))
            task.add_done_callback(self._finished)
        done, _ = await asyncio.wait({task}, timeout=wait)
        if not done:
            return None
        self._task = None
        return task.result()

    def _finished(self, task: asyncio.Task[StateView]) -> None:
        self._done_at = self._clock()
        if not task.cancelled():
            task.exception()  # marked retrieved: ask() raises it, if it is taken at all

    async def close(self) -> None:
        """Cancel a query still running; never raises."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            # A query that failed in the same turn ends with its error, not cancelled.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


ClientFactory = Callable[[], Awaitable[Client]]
"""Returns a connected Temporal client (pydantic data converter); raises if it cannot."""

_runtime: Runtime | None = None


def _quiet_runtime() -> Runtime:
    """One SDK runtime per process whose core logs only errors: the agent logs an outage
    once itself, instead of the core's warning per retried call."""
    global _runtime
    if _runtime is None:
        _runtime = Runtime(
            telemetry=TelemetryConfig(
                logging=LoggingConfig(
                    filter=TelemetryFilter(core_level="ERROR", other_level="ERROR")
                )
            )
        )
    return _runtime


def client_factory(address: str | None, namespace: str, interval: float) -> ClientFactory:
    """A factory making one connection attempt (the agent's own loop is the retry).

    Args:
        address: Temporal ``host:port``; ``None`` means :data:`DEFAULT_ADDRESS`.
        namespace: Temporal namespace.
        interval: the heartbeat interval in seconds; bounds each attempt and its retries.

    Calls retry only briefly (within one heartbeat interval): a beat that cannot get through
    now is replaced by the next one, which carries fresher lists anyway. The factory raises
    whatever ``Client.connect`` raises, or ``asyncio.TimeoutError``.
    """

    async def factory() -> Client:
        return await asyncio.wait_for(
            Client.connect(
                address or DEFAULT_ADDRESS,
                namespace=namespace,
                data_converter=pydantic_data_converter,
                runtime=_quiet_runtime(),
                retry_config=RetryConfig(
                    initial_interval_millis=100,
                    max_interval_millis=500,
                    max_retries=3,
                    max_elapsed_time_millis=int(max(interval, 1.0) * 1000),
                ),
            ),
            timeout=max(2.0, interval),
        )

    return factory


def short_error(exc: BaseException) -> str:
    """One short line for a log: the SDK's connection errors are long Rust debug dumps."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "ConnectionRefused" in text or "tcp connect error" in text:
        return "connection refused"
    return text if len(text) <= 160 else text[:157] + "..."
