"""The agent's own Prometheus series, served by ``reaper agent --metrics-port PORT``.

Each :class:`AgentMetrics` has a registry of its own, so that several agents in one process
(the tests) count apart. Series:

- ``reaper_agent_engine_up`` (gauge): 1 while the container engine answers, 0 while it does
  not (``docker`` runtime);
- ``reaper_agent_tasks_started_total`` (counter): assigned tasks started;
- ``reaper_agent_task_start_failures_total{service,reason}`` (counter): assigned tasks not
  started, once per task and reason: ``missing-template``, ``bad-template``,
  ``engine-error``;
- ``reaper_agent_orphans_removed_total{kind}`` (counter): orphans removed (one per object);
- ``reaper_agent_removals_refused_total{kind}`` (counter): removals the engine refused (a
  volume in use), one per attempt; tried again every beat.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

log = logging.getLogger("reaper.agent")


class AgentMetrics:
    """The agent's counters and gauges, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.engine_up = Gauge(
            "reaper_agent_engine_up",
            "1 while the container engine answers, 0 while it does not.",
            registry=self.registry,
        )
        self.tasks_started = Counter(
            "reaper_agent_tasks_started",
            "Assigned tasks started.",
            registry=self.registry,
        )
        self.start_failures = Counter(
            "reaper_agent_task_start_failures",
            "Assigned tasks not started, once per task and reason.",
            ["service", "reason"],
            registry=self.registry,
        )
        self.orphans_removed = Counter(
            "reaper_agent_orphans_removed",
            "Orphans removed, by kind.",
            ["kind"],
            registry=self.registry,
        )
        self.removals_refused = Counter(
            "reaper_agent_removals_refused",
            "Removals the engine refused (a volume in use), one per attempt.",
            ["kind"],
            registry=self.registry,
        )

    def serve(self, port: int) -> bool:
        """Serve these series at ``http://0.0.0.0:PORT/metrics`` in a daemon thread.

        Returns:
            False (logged) if the port cannot be bound: the agent keeps heartbeating.
        """
        try:
            start_http_server(port, registry=self.registry)
        except OSError as exc:
            log.warning("agent metrics not served: port %d: %s", port, exc.strerror or exc)
            return False
        log.info("agent metrics on http://0.0.0.0:%d/metrics", port)
        return True
