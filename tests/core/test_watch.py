"""``reaper.infra.watch.OutageWatch``: a watch runs from the first look at which every check
answers, after a failure or the start, to the next failure, on a monotonic clock. Its
checks here are plain callables over a clock the test moves; Temporal's health service and
Postgres are asked in tests/e2e/test_busy_look.py."""

from __future__ import annotations

import asyncio

from reaper.infra.watch import OutageWatch


class Script:
    """Health answers in order (``True``, ``False`` or an exception), and a clock."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.now = 100.0

    async def check(self) -> object:
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


async def test_a_watch_runs_from_the_first_answer_until_a_failure():
    s = Script(True, True, ConnectionError("refused"), True, False, True)
    watch = OutageWatch([s.check], clock=lambda: s.now)
    assert watch.watched_for() == 0.0  # never reached yet
    await watch.look()
    s.now += 30
    await watch.look()  # still up: the watch goes on
    assert watch.watched_for() == 30.0
    await watch.look()  # refused: broken
    assert watch.watched_for() == 0.0
    s.now += 5
    await watch.look()  # back: a new watch from now
    s.now += 2
    assert watch.watched_for() == 2.0
    await watch.look()  # the server answers "not serving": broken too
    assert watch.watched_for() == 0.0
    await watch.look()
    assert watch.watched_for() == 0.0  # begun just now


async def test_one_check_that_timed_out_proves_nothing_two_do():
    """A stopped or starved process finds its check's deadline passed before it reads the
    answer (the busy-host test's SIGSTOP did): once is inconclusive, twice a hung server."""
    s = Script(True, TimeoutError(), True, TimeoutError(), TimeoutError(), True)
    watch = OutageWatch([s.check], clock=lambda: s.now)
    await watch.look()
    s.now += 10
    await watch.look()  # timed out once: the watch goes on
    await watch.look()
    assert watch.watched_for() == 10.0
    await watch.look()
    await watch.look()  # twice in a row: broken
    assert watch.watched_for() == 0.0
    await watch.look()
    s.now += 1
    assert watch.watched_for() == 1.0


async def test_the_watch_needs_every_check_to_answer():
    temporal, postgres = Script(True, True, True), Script(True, OSError("down"), True)
    watch = OutageWatch([temporal.check, postgres.check], clock=lambda: temporal.now)
    await watch.look()
    temporal.now += 5
    assert watch.watched_for() == 5.0
    await watch.look()  # Postgres refused: broken, whatever Temporal said
    assert watch.watched_for() == 0.0
    await watch.look()
    temporal.now += 1
    assert watch.watched_for() == 1.0


async def test_running_checks_in_the_background_until_the_block_ends():
    looks = 0

    async def check() -> bool:
        nonlocal looks
        looks += 1
        return True

    watch = OutageWatch([check], interval=0.01)
    async with watch.running():
        async with asyncio.timeout(10):
            while looks < 3:  # polled, with a deadline
                await asyncio.sleep(0.01)
        assert watch.watched_for() > 0.0
    names = {t.get_name() for t in asyncio.all_tasks()}
    assert "temporal-watch" not in names  # cancelled and awaited when the block ended
