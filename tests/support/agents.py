"""Simulated agents heartbeating in the background against a real dev server: the kit's
(:class:`reaper.kit.fleet.SimFleet`), driven by a dict of reports."""

from __future__ import annotations

from typing import Any

from temporalio.client import Client

from reaper.kit.agents import SimAgent
from reaper.kit.fleet import SimFleet


class Agents(SimFleet):
    """Simulated agents, one per key of ``reports``, each beating every ``interval`` seconds
    with its complete report (``reports[worker]``: kind -> handles; change it to drop or add
    handles, add or delete a key to start or stop an agent). Each agent's boot id is
    ``boot-1`` and its ``seq`` starts at 1, as ``tests.support.heartbeats.beat`` sends them.
    A failed beat is skipped (an agent keeps trying through an outage). Use as a context
    manager inside a running loop."""

    def __init__(self, client: Client, task_queue: str, interval: float = 1.0) -> None:
        super().__init__(client, task_queue, interval)
        self.reports: dict[str, dict[str, Any]] = {}

    def before_round(self) -> None:
        for name in [n for n in self.agents if n not in self.reports]:
            del self.agents[name]
        for name, report in self.reports.items():
            if name not in self.agents:
                self.add([SimAgent(name, boot_id="boot-1", seq=1)])
            self.agents[name].lists = report

    def __enter__(self) -> Agents:
        super().__enter__()
        return self
