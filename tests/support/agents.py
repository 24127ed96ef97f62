"""Simulated agents heartbeating in the background against a real dev server: the kit's
(:class:`reaper.kit.fleet.SimFleet`), driven by a dict of reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from temporalio.client import Client

from reaper.kit.agents import SimAgent
from reaper.kit.fleet import SimFleet
from reaper.kit.processes import Child, environment


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


class AgentProcess(Child):
    """``reaper agent ARGS`` as a child process (the kit's :class:`Child`; no ``REAPER_*`` of
    the caller), logging one JSON object per line to ``log`` (its standard error is not a
    terminal), from ``log``'s folder (no ``.env`` of the repository)."""

    def __init__(self, args: list[str], log: Path) -> None:
        super().__init__(
            f"agent {' '.join(args[:2])}",
            [sys.executable, "-m", "reaper.cli", "agent", *args],
            environment({"PYTHONUNBUFFERED": "1"}),
            log_path=log,
            restart=False,
            cwd=log.parent,
        )
        self.log = log

    def lines(self) -> list[dict[str, Any]]:
        """The log's JSON records so far (other lines skipped)."""
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def messages(self, containing: str) -> list[str]:
        """The logged messages that contain ``containing``."""
        return [r["msg"] for r in self.lines() if containing in str(r.get("msg", ""))]
