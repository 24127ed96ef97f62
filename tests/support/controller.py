"""Controllers for tests: in process (a worker on its own task queue, with test settings) or
as a child process (:class:`ControllerProcess`, the kit's ``python worker.py``)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker, WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.workflow import _Definition

from activities import ReaperActivities
from reaper.core.config import Settings
from reaper.core.models import Timings
from reaper.core.policy.rollout import RELEASE_LINES
from reaper.infra.temporal import workflow_task_executor
from reaper.kit.controller import Controller
from reaper.kit.processes import find_binary as kit_find_binary
from tests.support.paths import ROOT
from worker import ControllerHooks
from workflows import ALL_WORKFLOWS
from workflows.common import fleet_monitor_id
from workflows.fleet import FleetMonitor
from workflows.replay import replay_check


def find_binary(name: str) -> str:
    """Path of a console script installed in this environment (``temporal``,
    ``temporal-test-server``): :func:`reaper.kit.processes.find_binary`."""
    return kit_find_binary(name)


class ControllerProcess(Controller):
    """``python worker.py`` as a child process that a test can signal, SIGKILL and restart
    (:class:`reaper.kit.controller.Controller`), with no metrics endpoints unless ``timings``
    asks: controllers of parallel runs on one host would contend for the default ports.

    Args:
        address, db_url: Temporal's frontend and the database.
        log: its log file (``log``).
        timings: ``REAPER_*`` variables (short timings).
        task_queue: another replica's, to share its work (a fresh one when omitted).
        root: the tree whose ``worker.py`` runs (another release's, exported), as its working
            directory and first on ``PYTHONPATH``, so that it imports its own ``workflows``,
            ``activities`` and ``reaper`` before the ones installed in this environment (the
            checkout under test, installed editable, comes later on ``sys.path``).
    """

    def __init__(
        self,
        address: str,
        db_url: str,
        log: Path,
        timings: dict[str, str],
        task_queue: str | None = None,
        root: Path = ROOT,
    ) -> None:
        settings = {"REAPER_METRICS_PORT": "0", "REAPER_SDK_METRICS_PORT": "0", **timings}
        if root != ROOT:
            path = os.environ.get("PYTHONPATH")
            settings["PYTHONPATH"] = os.pathsep.join([str(root), *([path] if path else [])])
        super().__init__(
            address, db_url, task_queue=task_queue, settings=settings, log_path=log, cwd=root
        )
        self.log = log
        self.root = root

    def tail(self, lines: int = 40) -> str:
        """The log's last lines, without tracebacks and the SDK's connection-retry noise."""
        if not self.log.exists():
            return ""
        kept = [
            ln
            for ln in self.log.read_text(errors="replace").splitlines()
            if ln.strip() and not ln.startswith((" ", "Traceback")) and "retried" not in ln
        ]
        return "\n".join(kept[-lines:])


def make_settings(**overrides: object) -> Settings:
    """Settings for tests: short, valid timings unless overridden."""
    base: dict[str, object] = dict(
        heartbeat_interval=10,
        stall_after=30,
        lost_after=300,
        missing_ttl=300,
        resync_interval=30,
        disruption_threshold=0.55,
    )
    base.update(overrides)
    # Without a fleet monitor there is no change feed: an unchanged report is re-diffed every
    # RESYNC_INTERVAL, as before the feed (the reference model assumes so), unless a test
    # sets the safety net apart.
    base.setdefault("full_resync_interval", base["resync_interval"])
    # The suite runs this line's workflow commands (``rollout.py``); a test of the previous
    # line's sets ``peer_version`` to it.
    base.setdefault("peer_version", RELEASE_LINES[-1])
    return Settings(_env_file=None, **base)  # type: ignore[arg-type]


_VALIDATED: set[type] = set()
"""Workflow classes the sandbox has validated in this process (:class:`ValidatedOnce`)."""


class Activations:
    """Counts the workflow activations an in-process controller has completed, queries
    left out: what a workflow's queries answer changes only in such an activation, so a test
    that waits for an answer asks again after the next one instead of on a clock
    (:meth:`after`). Polling every 50 ms cost a query of the liveness and two of the
    collector each time, and under CPU load, when a beat takes longer to be handled, the
    polls multiplied and took CPU from the work they waited for."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.count = 0
        self._waiters: list[asyncio.Future[None]] = []

    def completed(self) -> None:
        """One activation completed (called on the worker's workflow threads)."""
        self._loop.call_soon_threadsafe(self._bump)

    def _bump(self) -> None:
        self.count += 1
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def after(self, seen: int, timeout: float) -> None:
        """Return once an activation completed after the count was ``seen``, or after
        ``timeout`` seconds."""
        if self.count > seen:
            return
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            pass


class _Counted(WorkflowInstance):
    """A workflow instance that tells :class:`Activations` of each activation it completes
    other than a query's."""

    def __init__(self, inner: WorkflowInstance, activations: Activations) -> None:
        self._inner = inner
        self._activations = activations

    def activate(self, act: Any) -> Any:
        completion = self._inner.activate(act)
        if any(not job.HasField("query_workflow") for job in act.jobs):
            self._activations.completed()
        return completion

    def get_serialization_context(self, command_info: Any) -> Any:
        return self._inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        return self._inner.get_external_store_context(command_info)

    def get_info(self) -> Any:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@dataclass(frozen=True)
class ValidatedOnce(SandboxedWorkflowRunner):
    """The SDK's default sandbox (the same restrictions, every workflow run imported
    afresh), validating each workflow class once per process instead of once per ``Worker``.

    A ``Worker`` validates every workflow it is given by creating a throw-away instance of it
    in the sandbox (importing its module afresh); the suite starts one controller per test,
    and that validation of the same four classes cost about 0.2 s of CPU each time (py-spy,
    tests/workflows). What it checks, that the module imports in the sandbox, cannot change
    within a process, and every workflow run imports it afresh in the sandbox anyway. With
    ``activations``, each instance reports its activations there."""

    activations: Activations | None = None

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        instance = super().create_instance(det)
        if self.activations is None:
            return instance
        return _Counted(instance, self.activations)

    def prepare_workflow(self, defn: _Definition) -> None:
        if defn.cls in _VALIDATED:
            return
        super().prepare_workflow(defn)
        _VALIDATED.add(defn.cls)


def controller(
    client: Client,
    pool: asyncpg.Pool,
    settings: Settings,
    task_queue: str,
    activations: Activations | None = None,
    **worker_options: Any,
) -> Worker:
    """An in-process controller worker on ``task_queue`` (the SDK's default sandbox, activations
    inline as ``REAPER_WORKFLOW_INLINE`` says; the
    repair of stuck livenesses replays as ``worker.py`` does), counting its activations in
    ``activations`` if given, with further ``Worker`` options if given
    (``max_cached_workflows=1``: nearly every activation replays its history first)."""
    acts = ReaperActivities(pool, settings, replay=replay_check())
    return Worker(
        client,
        task_queue=task_queue,
        workflows=ALL_WORKFLOWS,
        activities=acts.all(),
        interceptors=[ControllerHooks()],
        **{
            "workflow_runner": ValidatedOnce(activations=activations),
            # As worker.py runs them (REAPER_WORKFLOW_INLINE), unless a test says otherwise.
            "workflow_task_executor": workflow_task_executor(settings.workflow_inline),
            **worker_options,
        },
    )


def evicting_controller(
    client: Client, pool: asyncpg.Pool, settings: Settings, task_queue: str
) -> Worker:
    """:func:`controller` caching one workflow (``max_cached_workflows=1``) with a 1 s sticky
    queue timeout: nearly every activation first replays its workflow's history, so a
    nondeterminism shows as a failed workflow task."""
    return controller(
        client,
        pool,
        settings,
        task_queue,
        max_cached_workflows=1,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
    )


async def start_monitor(client: Client, settings: Settings, task_queue: str) -> WorkflowHandle:
    """Start the fleet monitor of ``task_queue`` unless one runs (as ``worker.py`` does)."""
    return await client.start_workflow(
        FleetMonitor.run,
        Timings.of(settings),
        id=fleet_monitor_id(task_queue),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
