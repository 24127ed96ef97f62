"""Metric 10's floor (bench/rotate.py), and the waves a migration is cut into, reaper's or
the floor's.

The floor is the cheapest way the same work can be done: the agents themselves, with no
controller. :func:`floor` runs before reaper's controller starts: the target agents beat
``BenchNoop`` workflows (bench/noop.py) at reaper's interval, and a driver in this process
plays a perfect scheduler, handing each service's next ``max_surge`` tasks straight to the
least loaded agents' lists and handing on the next as soon as an accepted beat carried one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from temporalio.client import Client

from reaper.kit.agents import SimAgent
from reaper.kit.fleet import SimFleet

T = TypeVar("T")


@dataclass
class Waves:
    """One migration, reaper's or the floor's; seconds from its start (``t0``)."""

    total: float
    ends: list[float]
    """When each wave ended: its last original stopped (reaper), its last task reported
    (the floor)."""
    parts: list[tuple[float, float, float]] = field(default_factory=list)
    """Reaper's waves only: the slowest service's (placed, running, stopped) after the wave
    before ended: the upkeep's placement, the agent's start and report, the upkeep's stop."""

    def durations(self) -> list[float]:
        return [b - a for a, b in zip([0.0, *self.ends[:-1]], self.ends, strict=True)]


def wave_ends(per_service: Sequence[Sequence[float]]) -> list[float]:
    """The end of each wave: the ``k``-th end of every service (its ``k``-th batch's last
    task), the latest over services; services with fewer waves count in the waves they
    have."""
    depth = max((len(s) for s in per_service), default=0)
    return [max(s[k] for s in per_service if len(s) > k) for k in range(depth)]


def batches(items: Sequence[T], surge: int) -> list[Sequence[T]]:
    """``items`` in waves of ``surge``, in order."""
    return [items[i : i + surge] for i in range(0, len(items), surge)]


async def floor(
    client: Client,
    task_queue: str,
    targets: list[str],
    services: dict[str, list[str]],
    surge: int,
    hb: float,
) -> Waves:
    """The agents alone: ``targets`` beat ``BenchNoop`` every ``hb`` seconds; each service
    keeps ``surge`` tasks in flight, each handed to the least loaded agent and counted done
    when an accepted beat carried it, the service's next task handed out at once (as reaper
    refills a service's surge). Its waves are each service's tasks ``surge`` at a time, in
    the order handed out."""
    reported: dict[str, asyncio.Event] = {}
    done: dict[str, float] = {}

    def on_beat(a: SimAgent, beats: list[dict[str, Any]], sent: float, acked: float | None) -> None:
        if acked is None:
            return
        for t in beats[-1].get("tasks", ()):
            if t in reported and not reported[t].is_set():
                done[t] = time.monotonic()
                reported[t].set()

    fleet = SimFleet(client, task_queue, hb, workflow="BenchNoop", on_beat=on_beat)
    agents = [SimAgent(n, lists={"containers": [], "volumes": [], "tasks": []}) for n in targets]
    fleet.start()
    fleet.add(agents, spread=hb)
    try:
        await asyncio.sleep(2 * hb)  # every agent past its first beat: a steady fleet
        t0 = time.monotonic()

        def least_loaded() -> SimAgent:
            return min(agents, key=lambda a: (len((a.lists or {})["tasks"]), a.name))

        async def slot(queue: list[str], order: list[str]) -> None:
            while queue:
                t = queue.pop(0)
                order.append(t)
                reported[t] = asyncio.Event()
                (least_loaded().lists or {})["tasks"].append(t)
                await reported[t].wait()

        orders: list[list[str]] = [[] for _ in services]
        slots = [
            slot(queue, orders[j])
            for j, queue in enumerate(list(ids) for ids in services.values())
            for _ in range(surge)
        ]
        await asyncio.wait_for(asyncio.gather(*slots), 600)
    finally:
        await fleet.stop()
    per_service = [[max(done[t] - t0 for t in b) for b in batches(o, surge)] for o in orders]
    ends = wave_ends(per_service)
    return Waves(max(ends), ends)
