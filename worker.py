"""The reaper controller: ``python worker.py`` runs the Temporal worker (CONTRACT.md §1).

On start it applies pending database migrations and registers missing search attributes.
It exits non-zero with one clear line on a bad configuration, or when Temporal or Postgres
is still unreachable after two minutes.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from datetime import timedelta
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import (
    Interceptor,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from activities import ReaperActivities, metrics, sealing
from activities.sealing import load_secret
from reaper import __version__
from reaper.core.config import ConfigError, Settings, load_settings
from reaper.core.models import Timings
from reaper.infra.db import (
    Unreachable,
    create_pool,
    migrate,
    postgres_unavailable,
    with_backoff,
)
from reaper.infra.metrics_endpoint import sdk_runtime, serving
from reaper.infra.temporal import (
    connect,
    ensure_search_attributes,
    while_unavailable,
    workflow_runner,
    workflow_task_executor,
    workflow_task_polling,
)
from reaper.logs import setup_logging
from workflows import ALL_WORKFLOWS, hooks
from workflows.common import SEARCH_ATTRIBUTES
from workflows.replay import replay_check

log = logging.getLogger("reaper.worker")


class ControllerHooks(Interceptor):
    """Lends the controller's workflows what they ask of this process by name
    (``workflows.hooks``): the seal of a forwarded report, keyed by the controller's secret
    (``activities.sealing``), and the counters of rejected and ignored input
    (``activities.metrics``). The SDK's extern functions carry them in, sandboxed or not;
    none shapes a decision, so a worker without them replays the same."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        """Adds the functions; intercepts nothing (returns ``None``)."""
        input.unsafe_extern_functions.update(
            {
                hooks.SEAL: sealing.seal,
                hooks.COUNT_REJECTED: metrics.count_rejected,
                hooks.COUNT_IGNORED: metrics.count_ignored,
            }
        )
        return None


def database_url(settings: Settings) -> str:
    """The configured Postgres URL, or the embedded server's (started if not running).

    The embedded server keeps its data under ``{state_dir}/postgres`` and outlives this
    process (``reaper run`` stops it), so a controller restart finds it still running.
    """
    if settings.database_url:
        return settings.database_url
    from reaper.kit.postgres import EmbeddedPostgres

    return EmbeddedPostgres(Path(settings.state_dir).resolve() / "postgres").start()


async def serve(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Run the controller until ``stop`` is set (or forever).

    Raises:
        Unreachable: Temporal or Postgres not reachable within two minutes.
    """
    url = database_url(settings)
    pool = await create_pool(url, timeouts=True)
    # Garbage collection has connections of its own: a collection blocked on a locked table
    # never holds those that heartbeats and reaps need (issue 11).
    gc_pool = await create_pool(url, timeouts=True, max_size=8)
    try:
        # Postgres may stop again while a replica starts (a restart, a failover): wait it out.
        applied = await with_backoff(lambda: migrate(pool), postgres_unavailable, "Postgres")
        await with_backoff(lambda: load_secret(pool), postgres_unavailable, "Postgres")
        if applied:
            log.info("migrations applied: %s", ", ".join(applied))
        runtime = sdk_runtime(settings.sdk_metrics_port)
        client = await connect(settings.temporal_address, settings.namespace, runtime=runtime)
        await while_unavailable(
            lambda: ensure_search_attributes(client, SEARCH_ATTRIBUTES),
            "registering search attributes",
        )
        replay = replay_check(runtime, settings.workflow_sandbox)
        acts = ReaperActivities(pool, settings, gc_pool=gc_pool, replay=replay)
        worker = Worker(
            client,
            task_queue=settings.task_queue,
            workflows=ALL_WORKFLOWS,
            activities=acts.all(),
            max_concurrent_activities=64,
            workflow_runner=workflow_runner(settings.workflow_sandbox),
            # Two workflows per worker (liveness and collector): REAPER_WORKFLOW_CACHE.
            max_cached_workflows=settings.workflow_cache,
            interceptors=[ControllerHooks()],
            # Replicas share the task queue; a workflow cached on a replica that died moves
            # to another one after this long (docs/operator-guide.md: "Several controllers").
            sticky_queue_schedule_to_start_timeout=timedelta(seconds=settings.sticky_timeout),
            # New workers' first tasks come from the shared queue (BENCHMARKS.md metric 8b).
            **workflow_task_polling(settings.workflow_task_pollers),
            # Activations on the event loop, not a thread pool (REAPER_WORKFLOW_INLINE).
            workflow_task_executor=workflow_task_executor(settings.workflow_inline),
        )
        log.info(
            "controller %s (reaper %s) serving task queue %r in namespace %r",
            client.identity,
            __version__,
            settings.task_queue,
            settings.namespace,
        )
        async with worker, serving(pool, settings):
            await start_fleet_monitor(client, settings)
            await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        await gc_pool.close()
        await pool.close()


async def start_fleet_monitor(client: Client, settings: Settings) -> None:
    """Start the ``reaper-fleet`` monitor unless one is running already, waiting out a
    Temporal that is briefly unavailable (``reaper.infra.temporal.while_unavailable``).

    Raises:
        Unreachable: Temporal stayed unavailable for ``CONNECT_DEADLINE_S``.
    """
    from temporalio.common import WorkflowIDConflictPolicy

    from workflows.common import fleet_monitor_id
    from workflows.fleet import FleetMonitor

    await while_unavailable(
        lambda: client.start_workflow(
            FleetMonitor.run,
            Timings.of(settings),
            id=fleet_monitor_id(settings.task_queue),
            task_queue=settings.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary="fleet disruption state",
        ),
        "starting the fleet monitor",
    )


def main() -> int:
    setup_logging(logging.INFO)
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"reaper: bad configuration: {exc}", file=sys.stderr)
        return 2

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop)

    try:
        asyncio.run(run())
    except Unreachable as exc:
        print(f"reaper: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
