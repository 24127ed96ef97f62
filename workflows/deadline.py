"""The liveness's one deadline timer: wait for work or the next deadline, cheaply and replay-safe."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Callable

from temporalio import workflow

DEADLINE_SLACK_S = 0.25
"""Timers fire this long after their deadline, never on it: ``workflow.now()`` of one
activation can differ by milliseconds between the first run and a replay (seen when the SDK
regroups back-to-back workflow tasks), and a decision taken on the boundary itself would
then differ too: a non-determinism error."""


class DeadlineTimer:
    """At most one running timer for a liveness, re-armed only when a deadline moves earlier.

    A heartbeat moves the deadline later but does not touch the timer: when it fires early,
    the loop finds the worker still running and arms the next one. So steady beats cost no
    timer events beyond one per ``STALL_AFTER`` (TEMPORAL.md: a timer restarted per beat
    costs about two history events a beat).
    """

    def __init__(self) -> None:
        self._timer: asyncio.Future[None] | None = None
        self._deadline = datetime.min.replace(tzinfo=timezone.utc)

    async def wait(
        self, deadline: datetime | None, has_work: Callable[[], bool], label: str
    ) -> datetime | None:
        """Wait until ``has_work()`` or ``deadline`` (UTC) plus the slack has passed.

        Returns:
            The deadline that passed, or ``None`` if work arrived first.
        """
        if has_work():
            return None
        if deadline is None:
            await workflow.wait_condition(has_work)
            return None
        delay = (deadline + timedelta(seconds=DEADLINE_SLACK_S) - workflow.now()).total_seconds()
        if delay <= 0:
            return deadline
        timer = self._timer
        if timer is None or timer.done() or self._deadline > deadline:
            if timer is not None and not timer.done():
                timer.cancel()
            self._deadline = deadline
            self._timer = timer = asyncio.ensure_future(workflow.sleep(delay, summary=label))
        await workflow.wait_condition(lambda: has_work() or timer.done())
        if not timer.done():
            return None
        self._timer = None
        return self._deadline
