"""Polling with a real-time deadline: how a test waits for something to have happened."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from temporalio.service import RPCError, RPCStatusCode

T = TypeVar("T")

BACKSTOP = 1.0
"""Seconds :func:`eventually` waits for a change at most before asking again anyway."""


class Changes(Protocol):
    """Something that tells when what a test waits for may have changed
    (:class:`tests.support.controller.Activations`)."""

    count: int

    async def after(self, seen: int, timeout: float) -> None: ...


async def eventually(
    fn: Callable[[], Awaitable[T]],
    check: Callable[[T], bool],
    timeout: float = 20.0,
    what: str = "condition",
    poll: float = 0.05,
    first: float | None = None,
    changes: Changes | None = None,
) -> T:
    """Poll ``fn`` until ``check`` holds, or fail after ``timeout`` real seconds.

    ``poll`` is the pause between tries (seconds). With ``first``, the first pause is that
    long and each later one twice the one before, up to ``poll``: for waits that usually end
    within milliseconds (a beat handled on the time-skipping server), without polling any
    faster than ``poll`` once the wait turns out long. With ``changes``, ``fn`` is asked
    again once ``changes`` tells of a change after the previous ask began (at most
    :data:`BACKSTOP` later), not on a clock."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    pause = poll if first is None else min(first, poll)
    while time.monotonic() < deadline:
        seen = changes.count if changes is not None else 0
        try:
            last = await fn()
        except RPCError as exc:
            # The time-skipping test server now and then lets a query time out while it
            # moves time; ask again (a real failure still ends at the deadline). So too when
            # the server says the workflow is busy (RESOURCE_EXHAUSTED, "consistent query
            # buffer is full"): it holds one query per workflow while a task is in flight
            # (history.MaxBufferedQueryCount, default 1), and a poll every 50 ms beside an
            # agent's query outlasts the SDK client's own retries of it (10 s) while a
            # first task holds its local reads on a loaded machine. And when a query times
            # out before a worker could process it (DEADLINE_EXCEEDED, "query timed out
            # before a worker could process it": the controller's poller was busy; a clean
            # clone's run beside four other test processes, test_durable).
            text = str(exc).lower()
            timed_out = "deadline" in text or "timeout" in text or "timed out" in text
            busy = exc.status in (RPCStatusCode.RESOURCE_EXHAUSTED, RPCStatusCode.DEADLINE_EXCEEDED)
            if not timed_out and not busy:
                raise
            await asyncio.sleep(pause)
            pause = min(2 * pause, poll)
            continue
        if check(last):
            return last
        if changes is not None:
            await changes.after(seen, max(0.0, min(BACKSTOP, deadline - time.monotonic())))
            continue
        await asyncio.sleep(pause)
        pause = min(2 * pause, poll)
    raise AssertionError(f"timed out waiting for {what}; last value: {last!r}")
