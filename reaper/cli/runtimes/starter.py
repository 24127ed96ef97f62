"""Starting an assigned task on an engine from its service's template (:mod:`.templates`).

A task is started once: its volumes (unless there), then its container, labelled for the
worker and the task (``reaper.worker``, ``reaper.task``) but with no handle: a task's
objects are reported as the task, and go with it when it is an orphan. (Labelled as
handles they would need rows in ``containers`` and ``volumes``, which nobody writes for the
replacements reaper places: each would be an orphan after ``MISSING_TTL``.) A task that
has a container already, in any state, is not started again, except that one left
``created`` by an interrupted start is started. A container that ended does not hold its
task (:mod:`.holding`): it is reported as the task's leftover, stays ``MISSING_TTL`` for
the operator to look at, and is removed as an orphan; a task still ``pending`` is then
started afresh on a later beat. A task whose template is missing or invalid, or that the
engine refuses (an image not on the host), is logged and counted once
(``reaper_agent_task_start_failures_total``), and nothing else happens: it stays
``pending`` until a template appears or the scheduler moves it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import docker.errors
from docker import APIClient
from docker.types import Ulimit

from reaper.cli.agent_metrics import AgentMetrics
from reaper.cli.runtimes.engine import Engine, EngineDown
from reaper.cli.runtimes.labels import labels_for
from reaper.cli.runtimes.listing import owned_containers, owned_volumes
from reaper.cli.runtimes.templates import Template, TemplateError, Templates, fill

log = logging.getLogger("reaper.agent")


class TaskStarter:
    """Starts ``worker``'s assigned tasks on ``engine`` from ``templates``."""

    def __init__(
        self, worker: str, engine: Engine, templates: Templates, metrics: AgentMetrics
    ) -> None:
        self.worker = worker
        self.engine = engine
        self.templates = templates
        self.metrics = metrics
        self._not_started: set[tuple[str, str]] = set()

    async def start(self, task_id: str) -> bool:
        """Start assigned ``task_id`` (see the module).

        Returns:
            True if it was started now; False if it has a container already, could not be
            started (logged once), or the engine is not answering.
        """
        try:
            mine = [
                c for c in await owned_containers(self.engine, self.worker) if c.task == task_id
            ]
            if mine:
                left = [c for c in mine if c.state == "created"]
                for c in left:  # an interrupted start: finish it
                    await self.engine.call("start container", APIClient.start, c.ref)
                return bool(left)
            service = self.templates.service_of(task_id)
            if service is None:
                self._not_start(
                    task_id, "unknown", "missing-template", "no template matches its id"
                )
                return False
            try:
                template = self.templates.load(service)
            except TemplateError as exc:
                reason = "missing-template" if "no template" in str(exc) else "bad-template"
                self._not_start(task_id, service, reason, str(exc))
                return False
            try:
                ref = await self._create(task_id, service, template)
            except TemplateError as exc:
                self._not_start(task_id, service, "bad-template", str(exc))
                return False
            await self.engine.call("start container", APIClient.start, ref)
        except EngineDown:
            return False
        except docker.errors.APIError as exc:
            self._not_start(
                task_id, "?", "engine-error", f"HTTP {exc.status_code}: {exc.explanation or exc}"
            )
            return False
        self.metrics.tasks_started.inc()
        log.info(
            "started task %s (service %s): container %s from %s",
            task_id,
            service,
            ref[:12],
            template.image,
            extra={"worker": self.worker, "kind": "tasks", "handle": task_id, "action": "started"},
        )
        return True

    async def _create(self, task_id: str, service: str, t: Template) -> str:
        """Create the task's volumes (unless there) and its container, each labelled with
        the worker and the task only (no handle: they are reported as the task, and go
        with it); the container's id.

        Raises:
            TemplateError: a name the template makes for this task is not one the engine
                takes.
        """
        names = {
            engine_name(fill(pattern, task_id, service, self.worker)): path
            for pattern, path in t.volumes.items()
        }
        container = engine_name(fill(t.name, task_id, service, self.worker)) if t.name else None
        binds: dict[str, Mapping[str, str]] = {}
        have = {v.ref for v in await owned_volumes(self.engine, self.worker) if v.task == task_id}
        for name, path in names.items():
            if name not in have:
                await self.engine.call(
                    "create volume",
                    APIClient.create_volume,
                    name=name,
                    labels=labels_for(self.worker, task=task_id),
                )
            binds[name] = {"bind": path, "mode": "rw"}
        labels = {**t.labels, **labels_for(self.worker, task=task_id)}
        env = {k: fill(v, task_id, service, self.worker) for k, v in t.env.items()}

        def create(api: APIClient) -> Any:
            host = api.create_host_config(binds=binds or None, **_host_options(t))
            return api.create_container(
                t.image,
                command=t.command,
                environment=env or None,
                labels=labels,
                name=container,
                host_config=host,
            )

        made = await self.engine.call("create container", create)
        return str(made["Id"])

    def _not_start(self, task_id: str, service: str, reason: str, why: str) -> None:
        """Log and count a task that is not started, once per task and reason."""
        if (task_id, reason) in self._not_started:
            return
        self._not_started.add((task_id, reason))
        self.metrics.start_failures.labels(service, reason).inc()
        log.warning(
            "task %s not started (%s): %s",
            task_id,
            reason,
            why,
            extra={"worker": self.worker, "kind": "tasks", "handle": task_id, "action": reason},
        )


def engine_name(text: str) -> str:
    """``text`` if Docker and Podman take it as a container or volume name
    (``[a-zA-Z0-9][a-zA-Z0-9_.-]*``, at most 128 characters here).

    Raises:
        TemplateError: they do not (a task id with other characters, say).
    """
    ok = text[:1].isascii() and text[:1].isalnum() and len(text) <= 128
    if ok and all(ch.isascii() and (ch.isalnum() or ch in "_.-") for ch in text):
        return text
    raise TemplateError(f"{text!r} is not a name the engine takes ([a-zA-Z0-9][a-zA-Z0-9_.-]*)")


def _host_options(t: Template) -> dict[str, Any]:
    """``create_host_config`` options from the template's runtime, network and limits."""
    opts: dict[str, Any] = {}
    if t.runtime:
        opts["runtime"] = t.runtime
    if t.network:
        opts["network_mode"] = t.network
    lim = t.limits
    if lim.memory is not None:
        opts["mem_limit"] = lim.memory
    if lim.cpus is not None:
        opts["nano_cpus"] = int(lim.cpus * 1e9)
    if lim.pids is not None:
        opts["pids_limit"] = lim.pids
    ulimits = [
        Ulimit(name=n, soft=v, hard=v)
        for n, v in (("nofile", lim.nofile), ("nproc", lim.nproc))
        if v
    ]
    if ulimits:
        opts["ulimits"] = ulimits
    return opts
