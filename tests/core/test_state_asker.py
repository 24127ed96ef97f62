"""The agent's carried ``state`` query (reaper.cli.agent_connection.StateAsker): one query at
a time, an answer that comes after its beat gave up taken by a later beat, a stale answer or
failure dropped, nothing left for asyncio to report, a stop that never raises.

The query is a plain coroutine here (the asker's scheduling is under test; the real query
runs against the dev server in tests/e2e/test_agent.py and test_demo.py)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from reaper.cli.agent_connection import StateAsker
from reaper.core.contract import StateView


def view(seq: int) -> StateView:
    return StateView(
        worker="w-1",
        state="running",
        boot_id="b-1",
        last_seq=seq,
        last_heartbeat_at=None,
        missing=0,
        assignments=[],
        orphans=[],
        draining=False,
        state_since=None,
        rejected=0,
        last_rejection=None,
        missing_by_kind={},
    )


class Controller:
    """Answers each query when the test lets it: ``answer(i)`` releases query ``i``, which
    then returns ``view(i)`` or raises what ``fail`` holds for it."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.release: list[asyncio.Event] = []
        self.fail: dict[int, BaseException] = {}
        self.now = 0.0

    async def query(self, handle: Any, deadline: float) -> StateView:
        i = len(self.asked)
        self.asked.append(deadline)
        self.release.append(asyncio.Event())
        await self.release[i].wait()
        if i in self.fail:
            raise self.fail[i]
        return view(i)

    def answer(self, i: int) -> None:
        self.release[i].set()

    def asker(self) -> StateAsker:
        return StateAsker(self.query, clock=lambda: self.now)


async def settle(asker: StateAsker) -> None:
    """Let a released query finish and its done callback run (no time passes)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_an_answer_after_its_beat_gave_up_is_taken_by_the_next_beat():
    c = Controller()
    asker = c.asker()
    assert await asker.ask(None, 0.01, 10.0, 2.0) is None  # the beat's wait ran out
    assert await asker.ask(None, 0.01, 10.0, 2.0) is None  # still one query, not two
    assert c.asked == [10.0]
    c.answer(0)
    await settle(asker)
    c.now += 1.0  # the next beat, one interval later
    got = await asker.ask(None, 0.01, 10.0, 2.0)
    assert got is not None and got.last_seq == 0
    assert c.asked == [10.0]  # taken, not asked again
    await asker.close()


async def test_a_stale_answer_is_dropped_and_asked_again():
    c = Controller()
    asker = c.asker()
    assert await asker.ask(None, 0.01, 10.0, 2.0) is None
    c.answer(0)
    await settle(asker)
    c.now += 17.0  # beats failed meanwhile: the answer waited 17 s (breaker, 2026-12-05)
    pending = asyncio.create_task(asker.ask(None, 5.0, 10.0, 2.0))
    await settle(asker)
    assert len(c.asked) == 2  # the old answer dropped, a new query asked
    c.answer(1)
    got = await pending
    assert got is not None and got.last_seq == 1
    await asker.close()


async def test_a_failure_is_raised_while_fresh_and_dropped_when_stale():
    c = Controller()
    c.fail = {0: TimeoutError("query 0"), 1: TimeoutError("query 1")}
    asker = c.asker()
    assert await asker.ask(None, 0.01, 10.0, 2.0) is None
    c.answer(0)
    await settle(asker)
    with pytest.raises(TimeoutError, match="query 0"):
        await asker.ask(None, 0.01, 10.0, 2.0)  # fresh: the beat hears of it
    assert await asker.ask(None, 0.01, 10.0, 2.0) is None  # and the next asks again
    c.answer(1)
    await settle(asker)
    c.now += 30.0
    pending = asyncio.create_task(asker.ask(None, 5.0, 10.0, 2.0))
    await settle(asker)
    c.answer(2)
    got = await pending  # the stale failure is not raised: a new query answers
    assert got is not None and got.last_seq == 2
    await asker.close()


async def test_a_failure_nobody_takes_is_not_reported_by_asyncio():
    reported: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        c = Controller()
        c.fail = {0: TimeoutError("never taken")}
        asker = c.asker()
        assert await asker.ask(None, 0.01, 10.0, 2.0) is None
        c.answer(0)
        await settle(asker)
        await asker.close()  # the agent stops: nobody takes the failure
        del asker
        gc.collect()
        await settle(StateAsker())
    finally:
        loop.set_exception_handler(None)
    assert reported == []


async def test_close_never_raises_even_when_the_query_fails_as_it_is_cancelled():
    async def fails_on_cancel(handle: Any, deadline: float) -> StateView:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("RPC failed just now") from None
        raise AssertionError("unreachable")

    asker = StateAsker(fails_on_cancel)
    assert await asker.ask(None, 0.01, 10.0, 2.0) is None
    await asker.close()  # returns: the agent goes on to close its host and retire
    assert await asker.ask(None, 0.01, 10.0, 2.0) is None  # a new query after a close
    await asker.close()
