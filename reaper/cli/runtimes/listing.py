"""Listing the worker's labelled containers and volumes (:mod:`.labels`) on an engine."""

from __future__ import annotations

from docker import APIClient

from reaper.cli.runtimes.engine import Engine
from reaper.cli.runtimes.labels import WORKER_LABEL, Owned, owned


async def owned_containers(engine: Engine, worker: str) -> list[Owned]:
    """``worker``'s containers in every engine state (the engine filters on
    ``reaper.worker``; :func:`~.labels.owned` keeps those with a handle or a task).

    Raises:
        EngineDown: the engine did not answer (it is marked down: a list judges its health).
    """
    rows = await engine.call(
        "list containers",
        APIClient.containers,
        all=True,
        filters={"label": f"{WORKER_LABEL}={worker}"},
        judge=True,
    )
    found = (owned(r["Id"], r.get("Labels"), worker, r.get("State") or "") for r in rows)
    return [o for o in found if o is not None]


async def owned_volumes(engine: Engine, worker: str) -> list[Owned]:
    """``worker``'s volumes, by name.

    Raises:
        EngineDown: the engine did not answer.
    """
    answer = await engine.call(
        "list volumes",
        APIClient.volumes,
        filters={"label": f"{WORKER_LABEL}={worker}"},
        judge=True,
    )
    found = (owned(v["Name"], v.get("Labels"), worker) for v in answer.get("Volumes") or [])
    return [o for o in found if o is not None]
