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
) -> T:
    """Poll ``fn`` until ``check`` holds, or fail after ``timeout`` real seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        try:
            last = await fn()
        except RPCError as exc:
            # The time-skipping test server now and then lets a query time out while it
            # moves time; ask again (a real failure still ends at the deadline).
            if "deadline" not in str(exc).lower() and "timeout" not in str(exc).lower():
                raise
            await asyncio.sleep(poll)
            continue
        if check(last):
            return last
        await asyncio.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}; last value: {last!r}")
