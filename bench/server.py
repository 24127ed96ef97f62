"""What the Temporal dev server spends: its CPU time (psutil) and its own Prometheus counters.

The bench starts the dev server with ``--metrics-port`` (bench/env.py);
:class:`ServerMeter` reads, at any moment, the CPU seconds of the ``temporal`` process and
the counters it exports at ``/metrics`` (parsed by prometheus-client's text parser):

- ``service_requests`` by ``service_name`` and ``operation``: the gRPC calls served by the
  frontend (what clients and workers call: ``SignalWithStartWorkflowExecution``,
  ``PollWorkflowTaskQueue``, ``RespondWorkflowTaskCompleted`` ...) and the calls between the
  server's own services (history, matching);
- ``persistence_requests`` by ``operation``: calls to the server's database
  (``UpdateWorkflowExecution``, ``CreateWorkflowExecution``, ``AppendHistoryNodes`` ...);
- ``visibility_persistence_latency_count`` by ``operation``: writes to the visibility store
  (``RecordWorkflowExecutionStarted``, ``UpsertWorkflowExecution``: a search attribute upsert);
- ``action`` by ``action_type``: what Temporal counts as billable actions (the unit of
  Temporal Cloud's pricing and of its per-namespace rate limit, actions per second).

Two readings make a :class:`ServerCost` (their difference); ``per(n)`` divides it by the
number of registrations or beats it paid for.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

import psutil
from prometheus_client.parser import text_string_to_metric_families

from bench.common import scrape

FRONTEND = "frontend"
INTERNAL = ("history", "matching")

# Calls that are not work done for a workflow: the server's and the bench's housekeeping.
_HOUSEKEEPING = {
    "GetSystemInfo",
    "DescribeNamespace",
    "ListNamespaces",
    "GetNamespace",
    "GetCurrentClusterMetadata",
    "ListClusterMetadata",
    "WatchNamespaces",
    "ListNexusEndpoints",
    "GetTaskQueueUserData",
    "UpdateShard",
    "AssertShardOwnership",
    "GetOrCreateShard",
}


@dataclass(frozen=True)
class Reading:
    """The dev server's CPU seconds (user + system) and its counters at one moment."""

    cpu: float
    rpcs: Counter[tuple[str, str]]
    """``service_requests`` by (service, operation)."""
    persistence: Counter[str]
    """``persistence_requests`` by operation (every service)."""
    visibility: Counter[str]
    """Visibility-store writes and reads by operation."""
    actions: Counter[str]
    """Billable actions by ``action_type``."""

    def totals(self) -> ServerCost:
        """Everything the server did since it started, as a :class:`ServerCost`."""
        return ServerCost(self.cpu, self.rpcs, self.persistence, self.visibility, self.actions)


@dataclass
class ServerCost:
    """What the dev server did between two readings (or that divided by a count)."""

    cpu: float = 0.0
    """CPU seconds."""
    rpcs: Counter[tuple[str, str]] = field(default_factory=Counter)
    persistence: Counter[str] = field(default_factory=Counter)
    visibility: Counter[str] = field(default_factory=Counter)
    actions: Counter[str] = field(default_factory=Counter)

    @property
    def frontend(self) -> float:
        """gRPC calls served by the frontend (clients and workers), housekeeping excluded."""
        return sum(v for (svc, op), v in self.rpcs.items() if svc == FRONTEND)

    @property
    def internal(self) -> float:
        """Calls between the server's services (history, matching)."""
        return sum(v for (svc, _), v in self.rpcs.items() if svc in INTERNAL)

    @property
    def db(self) -> float:
        """Persistence calls (the server's database), housekeeping excluded."""
        return sum(self.persistence.values())

    @property
    def action_count(self) -> float:
        """Billable actions (every ``action_type``)."""
        return sum(self.actions.values())

    def minus(self, other: ServerCost) -> ServerCost:
        return ServerCost(
            self.cpu - other.cpu,
            _sub(self.rpcs, other.rpcs),
            _sub(self.persistence, other.persistence),
            _sub(self.visibility, other.visibility),
            _sub(self.actions, other.actions),
        )

    def scaled(self, k: float) -> ServerCost:
        """Every figure multiplied by ``k`` (``per(n)`` is ``scaled(1 / n)``)."""
        return ServerCost(
            self.cpu * k,
            Counter({key: v * k for key, v in self.rpcs.items()}),
            Counter({key: v * k for key, v in self.persistence.items()}),
            Counter({key: v * k for key, v in self.visibility.items()}),
            Counter({key: v * k for key, v in self.actions.items()}),
        )

    def per(self, n: float) -> ServerCost:
        return self.scaled(1.0 / max(n, 1e-9))

    def top(self, what: str, n: int = 8) -> str:
        """The ``n`` largest counts of ``rpcs`` (frontend), ``internal``, ``persistence`` or
        ``visibility`` or ``actions`` as ``Op 1.0, Op 0.5``."""
        if what in ("frontend", "internal"):
            items: dict[str, float] = {}
            for (svc, op), v in self.rpcs.items():
                if (svc == FRONTEND) == (what == "frontend"):
                    items[f"{svc}.{op}" if what == "internal" else op] = v
        else:
            items = dict(getattr(self, what))
        shown = sorted(((v, k) for k, v in items.items() if abs(v) >= 0.005), reverse=True)[:n]
        return ", ".join(f"{k} {v:.2f}" for v, k in shown) or "none"


def _sub(a: Counter, b: Counter) -> Counter:
    out: Counter = Counter()
    for k in set(a) | set(b):
        d = a.get(k, 0) - b.get(k, 0)
        if d:
            out[k] = d
    return out


def cost_between(a: Reading, b: Reading) -> ServerCost:
    """What the server did from reading ``a`` to reading ``b``."""
    return b.totals().minus(a.totals())


def temporal_processes() -> list[psutil.Process]:
    """The dev servers among this process's children (by name, ``temporal``)."""
    return [p for p in psutil.Process().children(recursive=True) if p.name() == "temporal"]


def cpu(procs: list[psutil.Process]) -> float:
    """CPU seconds (user + system) of ``procs`` so far; one that exited counts 0."""
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


class ServerMeter:
    """The bench's dev server: its process (:func:`temporal_processes`) and its metrics
    endpoint ``http://127.0.0.1:{metrics_port}/metrics``."""

    def __init__(self, metrics_port: int) -> None:
        self.metrics_port = metrics_port
        self.procs = temporal_processes()

    def cpu(self) -> float:
        """Its CPU seconds (user + system) so far."""
        return cpu(self.procs)

    def _scrape(self) -> str:
        return scrape(self.metrics_port)

    async def read(self) -> Reading:
        """The CPU time and the counters now (the scrape runs in a thread)."""
        cpu = self.cpu()
        text = await asyncio.to_thread(self._scrape)
        rpcs: Counter[tuple[str, str]] = Counter()
        persistence: Counter[str] = Counter()
        visibility: Counter[str] = Counter()
        actions: Counter[str] = Counter()
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name in ("action", "action_total"):
                    actions[s.labels.get("action_type", "")] += int(s.value)
                    continue
                op = s.labels.get("operation", "")
                if op in _HOUSEKEEPING:
                    continue
                if s.name == "service_requests_total":
                    rpcs[(s.labels.get("service_name", ""), op)] += int(s.value)
                elif s.name == "persistence_requests_total":
                    persistence[op] += int(s.value)
                elif s.name == "visibility_persistence_latency_count":
                    visibility[op] += int(s.value)
        return Reading(cpu, rpcs, persistence, visibility, actions)
