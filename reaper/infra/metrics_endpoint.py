"""The controller's Prometheus endpoints (CONTRACT.md §5.4).

- ``REAPER_METRICS_PORT`` (default 9464): reaper's series at ``/metrics``: the counters and
  histograms of ``activities.metrics`` (registered in the default registry when the
  activities are imported, as ``worker.py`` does), the fleet's gauges
  (:class:`FleetCollector`), and prometheus-client's process and Python series.
- ``REAPER_SDK_METRICS_PORT`` (default 9465): the Temporal SDK's own series (``temporal_*``,
  from its Rust core's Prometheus exporter: :func:`sdk_runtime`).

The fleet's gauges are read from Postgres by one small read every few seconds in the
controller's event loop (never from a workflow), so every replica shows the same fleet; a
scrape serves the latest read from memory. A port that cannot be bound is logged and left
off: the controller keeps reaping (alert on ``up`` to notice).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator

import asyncpg
from prometheus_client import REGISTRY, Counter, disable_created_metrics, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from reaper.core import kinds, states
from reaper.core.config import Settings
from reaper.core.policy.gauges import FleetGauges, WorkerRow, fleet_gauges

log = logging.getLogger("reaper.metrics")

FLEET_REFRESH_S = 5.0
"""How often the fleet's gauges are read from Postgres, at most (seconds); more often when
``REAPER_HEARTBEAT_INTERVAL`` is shorter."""

_READ_WORKERS = (
    "SELECT name, state, last_heartbeat_at, draining AND drained_at IS NOT NULL AS drained,"
    f" {kinds.COMPLETE_COLUMNS} FROM reaper.workers WHERE state = ANY($1::text[])"
)
"""Workers in the fleet ($1, ``states.IN_FLEET``), with their last complete report per kind."""
_READ_OWED = "SELECT count(*) FROM reaper.tasks WHERE state = $1 AND worker IS NULL"
"""Owed replacements: placed ($1, ``states.PLACED``) on no worker (§5.1)."""

REFRESH_ERRORS = Counter(
    "reaper_fleet_refresh_errors",
    "Reads of the fleet's gauges from Postgres that failed (the gauges keep their last values).",
)


async def read_fleet(pool: asyncpg.Pool, threshold: float, resync_interval: float) -> FleetGauges:
    """The fleet's gauges from one read-only snapshot of ``reaper.workers`` and the owed
    tasks; lags are measured against Postgres' clock (``now()``), not this host's.

    Args:
        threshold: ``REAPER_DISRUPTION_THRESHOLD``.
        resync_interval: ``REAPER_RESYNC_INTERVAL``, seconds (for
            ``reaper_workers_reports_incomplete``).
    """
    async with pool.acquire() as conn, conn.transaction(readonly=True, isolation="repeatable_read"):
        now = await conn.fetchval("SELECT now()")
        rows = await conn.fetch(_READ_WORKERS, states.IN_FLEET)
        owed = await conn.fetchval(_READ_OWED, states.PLACED.value)
    workers = (
        WorkerRow(
            r["name"],
            r["state"],
            r["last_heartbeat_at"],
            r["drained"],
            kinds.complete_times(r),
        )
        for r in rows
    )
    return fleet_gauges(workers, owed, threshold, now, resync_interval)


class FleetCollector(Collector):
    """Serves the latest :class:`FleetGauges` read (nothing before the first read).

    Series: ``reaper_workers{state}``, ``reaper_fleet_disruption``,
    ``reaper_replacements_owed``, ``reaper_workers_reports_incomplete``,
    ``reaper_heartbeat_lag_max_seconds{state}``,
    ``reaper_worker_last_heartbeat_timestamp_seconds{worker}`` and
    ``reaper_fleet_refreshed_timestamp_seconds`` (when the gauges were read).
    """

    def __init__(self) -> None:
        self.gauges: FleetGauges | None = None
        self.refreshed_at: float | None = None

    def collect(self) -> Iterator[Metric]:
        """prometheus-client's hook: the gauges as metric families (runs on scrape)."""
        g, at = self.gauges, self.refreshed_at
        if g is None or at is None:
            return
        workers = GaugeMetricFamily(
            "reaper_workers",
            "Workers by state as Postgres holds them (retired not counted).",
            labels=["state"],
        )
        for state, n in g.workers.items():
            workers.add_metric([state], n)
        yield workers
        yield GaugeMetricFamily(
            "reaper_fleet_disruption",
            "0: no worker stalled or lost; 1: some, below the threshold; 2: at or above it.",
            value=g.disruption,
        )
        yield GaugeMetricFamily(
            "reaper_replacements_owed",
            "Owed replacements: pending tasks with no worker.",
            value=g.owed,
        )
        yield GaugeMetricFamily(
            "reaper_workers_drained",
            "Drained workers: draining and holding no pending or running task (their hosts"
            " may be terminated, then retired).",
            value=g.drained,
        )
        yield GaugeMetricFamily(
            "reaper_workers_reports_incomplete",
            "Running workers whose heartbeats have carried no complete report of some kind"
            " for longer than RESYNC_INTERVAL (liveness only: nothing on them is marked,"
            " destroyed, started or removed).",
            value=g.reports_incomplete,
        )
        lag = GaugeMetricFamily(
            "reaper_heartbeat_lag_max_seconds",
            "Seconds since the stalest last heartbeat (as Postgres holds it) among workers in"
            " the state.",
            labels=["state"],
        )
        for state, seconds in g.lag_max.items():
            lag.add_metric([state], seconds)
        yield lag
        last = GaugeMetricFamily(
            "reaper_worker_last_heartbeat_timestamp_seconds",
            "Unix time of each worker's last heartbeat as Postgres holds it (may lag the"
            " liveness workflow by up to STALL_AFTER).",
            labels=["worker"],
        )
        for worker, ts in g.last_heartbeat.items():
            last.add_metric([worker], ts)
        yield last
        yield GaugeMetricFamily(
            "reaper_fleet_refreshed_timestamp_seconds",
            "Unix time of the last successful read of the fleet's gauges from Postgres.",
            value=at,
        )

    async def refresh(self, pool: asyncpg.Pool, threshold: float, resync_interval: float) -> None:
        """Read the gauges once; a failure is logged and counted, the last values kept."""
        try:
            self.gauges = await read_fleet(pool, threshold, resync_interval)
            self.refreshed_at = time.time()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
            REFRESH_ERRORS.inc()
            log.warning("fleet gauges not refreshed: %s", exc)

    async def run(
        self, pool: asyncpg.Pool, threshold: float, resync_interval: float, every: float
    ) -> None:
        """Refresh every ``every`` seconds until cancelled."""
        while True:
            await self.refresh(pool, threshold, resync_interval)
            await asyncio.sleep(every)


def sdk_runtime(port: int) -> Runtime | None:
    """A Temporal runtime whose metrics are served in Prometheus text format on
    ``0.0.0.0:port`` (the SDK's default names, e.g. ``temporal_workflow_task_execution_latency``
    in milliseconds), or ``None`` (the SDK's default runtime) when ``port`` is 0 or cannot be
    bound (logged)."""
    if not port:
        return None
    try:
        config = TelemetryConfig(metrics=PrometheusConfig(bind_address=f"0.0.0.0:{port}"))
        return Runtime(telemetry=config)
    except Exception as exc:  # the SDK's core raises RuntimeError/ValueError on a bind failure
        log.error("Temporal SDK metrics not served on port %s: %s", port, exc)
        return None


@contextlib.asynccontextmanager
async def serving(pool: asyncpg.Pool, settings: Settings) -> AsyncIterator[FleetCollector | None]:
    """Serve ``/metrics`` on ``settings.metrics_port`` while the block runs, with the fleet's
    gauges refreshed in the background; yields the collector, or ``None`` when the port is 0
    or cannot be bound (logged; the controller runs on without it)."""
    if not settings.metrics_port:
        yield None
        return
    disable_created_metrics()  # no ``*_created`` series beside every counter
    try:
        server, thread = start_http_server(settings.metrics_port, addr="0.0.0.0")
    except OSError as exc:
        log.error("metrics not served on port %s: %s", settings.metrics_port, exc)
        yield None
        return
    fleet = FleetCollector()
    REGISTRY.register(fleet)
    every = min(FLEET_REFRESH_S, settings.heartbeat_interval)
    task = asyncio.get_running_loop().create_task(
        fleet.run(pool, settings.disruption_threshold, settings.resync_interval, every)
    )
    log.info("metrics on http://0.0.0.0:%s/metrics", settings.metrics_port)
    try:
        yield fleet
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        REGISTRY.unregister(fleet)
        server.shutdown()
        server.server_close()
        thread.join(5)
