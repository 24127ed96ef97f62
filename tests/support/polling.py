"""Polling with a real-time deadline: how a test waits for something to have happened."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from temporalio.service import RPCError

T = TypeVar("T")


async def eventually(
    fn: Callable[[], Awaitable[T]],
    check: Callable[[T], bool],
    timeout: float = 20.0,
    what: str = "condition",
    poll: float = 0.05,
    first: float | None = None,
) -> T:
    """Poll ``fn`` until ``check`` holds, or fail after ``timeout`` real seconds.

    ``poll`` is the pause between tries (seconds). With ``first``, the first pause is that
    long and each later one twice the one before, up to ``poll``: for waits that usually end
    within milliseconds (a beat handled on the time-skipping server), without polling any
    faster than ``poll`` once the wait turns out long."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    pause = poll if first is None else min(first, poll)
    while time.monotonic() < deadline:
        try:
            last = await fn()
        except RPCError as exc:
            # The time-skipping test server now and then lets a query time out while it
            # moves time; ask again (a real failure still ends at the deadline).
            if "deadline" not in str(exc).lower() and "timeout" not in str(exc).lower():
                raise
            await asyncio.sleep(pause)
            pause = min(2 * pause, poll)
            continue
        if check(last):
            return last
        await asyncio.sleep(pause)
        pause = min(2 * pause, poll)
    raise AssertionError(f"timed out waiting for {what}; last value: {last!r}")
