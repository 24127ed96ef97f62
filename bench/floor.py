"""The floor of metric 4 under load: the cheapest liveness Temporal can run, beaten like
reaper's fleet and killed the same way, and the CPU hog of 4d/4e.

``BenchWatch`` (bench/noop.py: unsandboxed, each beat restarts one timer of ``LOST_AFTER``;
no rule, no row, no reap) is beaten by a fleet of the same size on the no-op worker before
reaper's fleet starts; victims are killed at once (alone, then with the hog), and each
one's close after its last beat is what a loss costs at the least under that load on this
machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator

from temporalio.client import Client

from bench.common import Progress
from bench.env import BenchEnv, NoopWorker
from bench.history import spread
from bench.loss import Loss, closes
from reaper.kit.agents import SimAgent
from reaper.kit.fleet import SimFleet
from reaper.kit.processes import Child

WATCH = "BenchWatch"
HOG = "while True: pass"


@contextlib.contextmanager
def cpu_hog(env: BenchEnv, on: bool = True) -> Iterator[None]:
    """``python -c "while True: pass"`` beside the stack for the block (if ``on``)."""
    if not on:
        yield
        return
    proc = Child("cpu hog", [sys.executable, "-c", HOG], restart=False)
    proc.start()
    env.others.append(proc)
    try:
        yield
    finally:
        proc.stop()


async def watch_fleet(
    client: Client, noop: NoopWorker, workers: int, interval: float, timeout: float = 300.0
) -> SimFleet:
    """``workers`` ``BenchWatch`` workflows (ids ``BenchWatch-watch-NNNNN``) beating the
    no-op worker every ``interval`` seconds, all added at once and first beats spread over
    one interval; returned once every one handled its first beat and one more interval
    passed. The caller stops the fleet."""
    fleet = SimFleet(client, noop.task_queue, interval, overlap=True, workflow=WATCH)
    base = await asyncio.to_thread(noop.handled, True)
    fleet.start()
    fleet.add([SimAgent(f"watch-{i:05d}") for i in range(workers)], spread=interval)
    await noop.wait_handled(base + workers, timeout, poll=0.25, first=True)
    await asyncio.sleep(interval)
    return fleet


async def watch_kill(
    client: Client, fleet: SimFleet, doomed: list[str], give_up: float
) -> list[float]:
    """Stop ``doomed``'s beats at once; each one's close after its last beat (seconds), for
    those closed within ``give_up`` seconds."""
    fleet.kill(doomed)
    ids = {f"{WATCH}-{n}": n for n in doomed}
    closed = await closes(client, list(ids), time.time() + give_up)
    last = {wid: fleet.agents[n].last_sent for wid, n in ids.items()}
    return [at - sent for wid, at in closed.items() if (sent := last[wid]) is not None]


async def watch_floors(
    env: BenchEnv,
    noop: NoopWorker,
    workers: int,
    victims: int,
    interval: float,
    give_up: float,
    hog: bool,
    progress: Progress,
) -> list[list[float]]:
    """A ``BenchWatch`` fleet of ``workers`` beating every ``interval`` seconds; ``victims``
    killed at once, then (with ``hog``) as many others with the CPU hog beside after one
    interval; per kill, each victim's close after its last beat (seconds)."""
    floors: list[list[float]] = []
    watch = await watch_fleet(env.client, noop, workers, interval)
    try:
        names = list(watch.agents)
        for g in range(2 if hog else 1):
            with cpu_hog(env, on=g == 1):
                if g:
                    await asyncio.sleep(interval)
                doomed = names[len(names) - victims * (g + 1) :][:victims]
                floors.append(await watch_kill(env.client, watch, doomed, give_up))
            worst = max(floors[-1], default=0.0)
            progress(f"  floor: BenchWatch kill {g + 1}, closed at most {worst:.2f} s after")
    finally:
        await watch.stop()
    return floors


def watch_text(loss: Loss) -> str:
    """How the ``BenchWatch`` victims closed after their last beat."""
    if not loss.watch:
        return "none within the wait"
    text = f"{spread(loss.watch)} after their last beat"
    if len(loss.watch) < len(loss.victims):
        text += f"; {len(loss.victims) - len(loss.watch)} not within {loss.give_up:.0f} s"
    return text


def worst_watch(loss: Loss) -> str:
    """How late the slowest ``BenchWatch`` victim closed after ``LOST_AFTER``."""
    if len(loss.watch) < len(loss.victims):
        return f"not all closed within {loss.give_up - loss.lost_after:.0f} s"
    return f"at most {max(loss.watch) - loss.lost_after:.2f} s"
