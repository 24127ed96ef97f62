"""The ``docker`` runtime: containers and volumes of a Docker Engine API (Docker, or Podman's
compatible service), reaper's by their labels (:mod:`.labels`).

- **Inventory** (:mod:`.holding`): ``containers`` and ``volumes`` are the ``reaper.handle``
  labels of the worker's objects in every engine state; ``tasks`` the ``reaper.task`` labels
  of its containers that run or start (:func:`~.holding.holds_task`): a task whose
  containers all ended, or that has a volume alone, is absent. What is left of such a task
  (its ended containers, its volumes) is reported as ``task:T`` under its kind, to become an
  orphan. A list the engine did not give is ``None`` (liveness only), never ``[]``.
- **Removing an orphan**: a container is stopped with the grace period (SIGTERM, then
  SIGKILL after ``stop_grace`` seconds: the engine's own ``stop``), then removed; a volume is
  removed, and when the engine refuses because a container still uses it (409) the refusal
  is logged and counted and the removal tried again on the next beat, never forced. An
  orphaned task takes its containers, then its volumes, with it. A task's leftovers
  (``task:T``) go unless the task is held again; its volumes once its containers are gone.
- **Starting a task**: from its service's template (:mod:`.starter`, :mod:`.templates`).
"""

from __future__ import annotations

import asyncio
import logging
import math

import docker.errors
from docker import APIClient

from reaper.cli.agent_metrics import AgentMetrics
from reaper.cli.runtimes import Inventory
from reaper.cli.runtimes.engine import Engine, EngineDown, is_gone
from reaper.cli.runtimes.holding import holds_task, is_leftover, leftover_task, report_lists
from reaper.cli.runtimes.labels import Owned
from reaper.cli.runtimes.listing import owned_containers, owned_volumes
from reaper.cli.runtimes.starter import TaskStarter
from reaper.cli.runtimes.templates import Templates

log = logging.getLogger("reaper.agent")

_NOT_RUNNING = {"created", "exited", "dead"}
"""Engine states of a container that has no process to stop."""


class DockerRuntime:
    """The worker's labelled containers and volumes on one engine.

    Args:
        worker: the agent's worker (the ``reaper.worker`` label it owns).
        engine: the engine's API.
        templates: per-service task templates.
        stop_grace: seconds between SIGTERM and SIGKILL when a container is stopped.
        metrics: the agent's series.
    """

    def __init__(
        self,
        worker: str,
        engine: Engine,
        templates: Templates,
        stop_grace: float,
        metrics: AgentMetrics,
    ) -> None:
        self.worker = worker
        self.engine = engine
        self.templates = templates
        self.stop_grace = stop_grace
        self.metrics = metrics
        self.starter = TaskStarter(worker, engine, templates, metrics)
        self._refused: set[str] = set()

    def describe(self) -> str:
        """``container engine at <url>, templates in <dir>``."""
        where = self.templates.directory or "(none: --templates not given)"
        return f"container engine at {self.engine.url}, templates in {where}"

    async def _containers(self) -> list[Owned]:
        return await owned_containers(self.engine, self.worker)

    async def _volumes(self) -> list[Owned]:
        return await owned_volumes(self.engine, self.worker)

    async def inventory(self) -> Inventory:
        """Both lists at once (one deadline per beat, not two), reported as
        :func:`~.holding.report_lists` says; ``None`` for a kind whose lists the engine did
        not give."""
        got = await asyncio.gather(self._containers(), self._volumes(), return_exceptions=True)
        for item in got:
            if isinstance(item, BaseException) and not isinstance(
                item, EngineDown | docker.errors.APIError
            ):
                raise item
        containers = got[0] if isinstance(got[0], list) else None
        volumes = got[1] if isinstance(got[1], list) else None
        return report_lists(containers, volumes)

    async def remove(self, kind: str, handle: str) -> bool:
        """Remove orphan ``handle`` of ``kind`` (see the module); True if anything went."""
        try:
            if is_leftover(handle) and kind in ("containers", "volumes"):
                return await self._remove_leftovers(kind, handle)
            if kind == "containers":
                return await self._remove_containers(
                    [c for c in await self._containers() if c.handle == handle], kind, handle
                )
            if kind == "volumes":
                return await self._remove_volumes(
                    [v for v in await self._volumes() if v.handle == handle], kind, handle
                )
            if kind == "tasks":
                gone = await self._remove_containers(
                    [c for c in await self._containers() if c.task == handle], kind, handle
                )
                # After its containers: a volume they used is free now.
                freed = await self._remove_volumes(
                    [v for v in await self._volumes() if v.task == handle], kind, handle
                )
                return gone or freed
        except EngineDown:
            return False  # logged by the engine; listed again on the next answer
        return False

    async def _remove_leftovers(self, kind: str, handle: str) -> bool:
        """Remove what is left of task ``T`` (``handle`` ``task:T``) of ``kind``: nothing
        while a container of ``T`` holds it again (the leftovers are not reported any
        more, and forgotten); its volumes only once its containers are gone (the orphan
        ``containers/task:T`` removes them; until then the volumes wait, unrefused)."""
        task = leftover_task(handle)
        mine = [c for c in await self._containers() if c.task == task]
        if any(holds_task(c.state) for c in mine):
            return False
        if kind == "containers":
            return await self._remove_containers(
                [c for c in mine if c.handle is None], kind, handle
            )
        if any(c.handle is None for c in mine):
            return False  # its containers first: they still use the volumes
        return await self._remove_volumes(
            [v for v in await self._volumes() if v.task == task and v.handle is None],
            kind,
            handle,
        )

    async def _remove_containers(self, found: list[Owned], kind: str, handle: str) -> bool:
        removed = False
        for c in found:
            try:
                if c.state not in _NOT_RUNNING:
                    grace = math.ceil(self.stop_grace)
                    await self.engine.call(
                        "stop container", APIClient.stop, c.ref, timeout=grace, extra_s=grace
                    )
                await self.engine.call("remove container", APIClient.remove_container, c.ref)
            except docker.errors.APIError as exc:
                if not is_gone(exc):  # gone meanwhile: nothing left to do
                    self._refusal(kind, handle, f"container {c.ref[:12]}", exc)
                continue
            removed = True
            self._refused.discard(f"{kind}/{handle}")
            self.metrics.orphans_removed.labels(kind).inc()
            log.info(
                "removed orphan %s/%s: container %s (was %s)",
                kind,
                handle,
                c.ref[:12],
                c.state,
                extra={"worker": self.worker, "kind": kind, "handle": handle, "action": "removed"},
            )
        return removed

    async def _remove_volumes(self, found: list[Owned], kind: str, handle: str) -> bool:
        removed = False
        for v in found:
            try:
                await self.engine.call("remove volume", APIClient.remove_volume, v.ref)
            except docker.errors.APIError as exc:
                if not is_gone(exc):
                    self._refusal(kind, handle, f"volume {v.ref}", exc)
                continue
            removed = True
            self._refused.discard(f"{kind}/{handle}")
            self.metrics.orphans_removed.labels(kind).inc()
            log.info(
                "removed orphan %s/%s: volume %s",
                kind,
                handle,
                v.ref,
                extra={"worker": self.worker, "kind": kind, "handle": handle, "action": "removed"},
            )
        return removed

    def _refusal(self, kind: str, handle: str, what: str, exc: docker.errors.APIError) -> None:
        """A removal the engine refused (409: a volume in use): counted every time, logged
        once until it succeeds; tried again on the next beat."""
        self.metrics.removals_refused.labels(kind).inc()
        key = f"{kind}/{handle}"
        if key not in self._refused:
            self._refused.add(key)
            log.warning(
                "orphan %s: the engine refused to remove %s (HTTP %s: %s); not forced, "
                "trying again every beat",
                key,
                what,
                exc.status_code,
                exc.explanation or exc,
                extra={"worker": self.worker, "kind": kind, "handle": handle, "action": "refused"},
            )

    async def start(self, task_id: str) -> bool:
        """Start assigned ``task_id`` from its template (:mod:`.starter`)."""
        return await self.starter.start(task_id)

    async def close(self) -> None:
        """Close the engine's connections."""
        self.engine.close()
