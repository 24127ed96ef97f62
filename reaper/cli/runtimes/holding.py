"""What an engine's objects say the worker holds: a task while one of its containers runs or
starts, a handle while its object exists; what is left of a task that is not held.

The ``docker`` runtime (:mod:`.docker`) reports, per kind of the contract:

- ``tasks``: every task one of whose containers is in a state that :func:`holds_task`
  (running, starting, paused). A task whose containers all exited, died or are being
  removed, or that has a volume and no container left, is *not held*: its worker reports it
  absent, so reaper marks it missing and, ``MISSING_TTL`` later, stops it (``stop_reason``
  ``missing``) and backfills its service (CONTRACT.md rules 4 and 5). Nothing on a host
  holds a task but a process of it.
- ``containers`` and ``volumes``: the objects labelled ``reaper.handle=H``, in every engine
  state (a handle is a container or volume row of the scheduler's: it is held while the
  object exists, running or not, as Concourse's containers are).
- The *leftovers* of a task that is not held (its exited or dead containers, its volumes)
  are reported under their kind as one handle per task, ``task:T``
  (:data:`LEFTOVER_PREFIX`). No row stands for them, so reaper lists each in the worker's
  ``orphans`` once it has been reported for ``MISSING_TTL`` (CONTRACT.md §2), the same TTL
  after which the task is stopped; the agent then removes them (:mod:`.docker`). A leftover
  whose task is held again (an operator ran ``docker start``) is not reported any more and
  is forgotten. An exited container thus stays ``MISSING_TTL`` for the operator to look at
  (``docker logs``), not for ever.

Handles starting with ``task:`` are reserved for leftovers: a ``reaper.handle`` label with
that prefix is neither reported nor removed as a handle (:func:`is_leftover`).

The agent may not import ``reaper.core.policy`` (it depends on the contract only), so this
rule of the engine's states lives here, beside the labels it reads, with its table test
(``tests/e2e/test_agent_runtimes.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from reaper.cli.runtimes.labels import Owned

HOLDS_TASK: Mapping[str, bool] = {
    # Docker's container states (Engine API ``State``), as Podman's service reports them too.
    "created": True,  # starting: created, not started yet (an interrupted start is finished)
    "restarting": True,  # starting again under its restart policy
    "running": True,
    "paused": True,  # frozen by an operator (`docker pause`); resumes where it was
    "removing": False,  # going away
    "exited": False,  # ended, on its own, stopped, or killed (`docker kill`, OOM)
    "dead": False,  # the engine failed to remove it: it will not run again
    # Podman's own names, should its compatible service pass them through.
    "configured": True,  # created, not initialised
    "initialized": True,  # about to start
    "stopping": False,  # being stopped
    "stopped": False,  # ended, not yet cleaned up
}
"""Whether a container in each engine state holds its task (starting or running: ``True``).

Paused holds: a pause is an operator's, deliberate and undone by ``docker unpause``; a task
stopped and replaced under it would surprise them. A task paused for good keeps its place
until it is unpaused or removed."""

LEFTOVER_PREFIX = "task:"
"""Handles ``task:T`` under ``containers`` and ``volumes``: what is left of task ``T``."""


def holds_task(state: str) -> bool:
    """Whether a container in engine state ``state`` holds its task (:data:`HOLDS_TASK`).

    A state the table does not know holds: an engine's new word never makes reaper stop a
    task and remove its container. Empty (no state given) does not hold.
    """
    if not state:
        return False
    return HOLDS_TASK.get(state.lower(), True)


def leftover_handle(task: str) -> str:
    """``task:T``: the handle under which task ``T``'s leftovers of one kind are reported."""
    return f"{LEFTOVER_PREFIX}{task}"


def is_leftover(handle: str) -> bool:
    """Whether ``handle`` names a task's leftovers (:data:`LEFTOVER_PREFIX`), not a handle."""
    return handle.startswith(LEFTOVER_PREFIX)


def leftover_task(handle: str) -> str:
    """The task whose leftovers ``handle`` (``task:T``) names: ``T``."""
    return handle.removeprefix(LEFTOVER_PREFIX)


def held_tasks(containers: Iterable[Owned]) -> set[str]:
    """The tasks one of whose ``containers`` is in a state that :func:`holds_task`."""
    return {c.task for c in containers if c.task is not None and holds_task(c.state)}


def leftovers(objects: Iterable[Owned], held: set[str]) -> set[str]:
    """The leftover handles (``task:T``) of ``objects`` of one kind: one per task that is
    not in ``held``, for its objects labelled with the task and no handle (an object with a
    ``reaper.handle`` is the scheduler's handle, reported and removed as such)."""
    return {
        leftover_handle(o.task)
        for o in objects
        if o.task is not None and o.handle is None and o.task not in held
    }


def handles(objects: Iterable[Owned]) -> set[str]:
    """The ``reaper.handle`` values of ``objects``, leaving out the reserved ``task:`` ones."""
    return {o.handle for o in objects if o.handle is not None and not is_leftover(o.handle)}


def report_lists(
    containers: list[Owned] | None, volumes: list[Owned] | None
) -> dict[str, list[str] | None]:
    """The complete lists of a beat from the worker's labelled objects (see the module).

    Args:
        containers: the worker's labelled containers with their states, or ``None`` when the
            engine did not list them.
        volumes: its labelled volumes, or ``None``.

    Returns:
        ``containers``, ``volumes`` and ``tasks``, each sorted and distinct; a kind is
        ``None`` (liveness only) when what it needs was not listed: ``containers`` and
        ``tasks`` need the containers, ``volumes`` needs both (whether a volume is a
        leftover depends on its task's containers).
    """
    if containers is None:
        return {"containers": None, "volumes": None, "tasks": None}
    held = held_tasks(containers)
    return {
        "containers": sorted(handles(containers) | leftovers(containers, held)),
        "volumes": None if volumes is None else sorted(handles(volumes) | leftovers(volumes, held)),
        "tasks": sorted(held),
    }
