"""Which containers and volumes of an engine are reaper's: its labels.

An object (container or volume) is reaper's, for the agent of worker ``W``, when it carries
``reaper.worker=W`` and at least one of:

- ``reaper.handle=H``: it is handle ``H`` of its kind (reported under ``containers`` or
  ``volumes``; an orphan ``H`` is removed);
- ``reaper.task=T``: it belongs to task ``T`` (reported under ``tasks`` while one of
  ``T``'s containers runs or starts, :mod:`.holding`; what is left of ``T`` otherwise is
  reported as ``task:T`` and becomes an orphan; when ``T`` is an orphan, every container and
  volume of it goes).

Everything else on the engine, unlabelled or another worker's, is neither reported nor
removed. Labels are fixed when an object is created (Docker and Podman cannot add one
later): adopting an existing container means re-creating it with the labels
(docs/agent-runtimes.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

RESERVED_PREFIX = "reaper."
"""Label keys the agent sets itself; a template may not set them."""
WORKER_LABEL = "reaper.worker"
HANDLE_LABEL = "reaper.handle"
TASK_LABEL = "reaper.task"


@dataclass(frozen=True)
class Owned:
    """One of reaper's objects on the engine.

    Attributes:
        ref: the engine's id (container) or name (volume).
        handle: its ``reaper.handle``, if any.
        task: its ``reaper.task``, if any.
        state: a container's engine state (``created``, ``running``, ``paused``,
            ``restarting``, ``removing``, ``exited``, ``dead``); ``""`` for a volume.
    """

    ref: str
    handle: str | None
    task: str | None
    state: str = ""


def owned(ref: str, labels: Mapping[str, str] | None, worker: str, state: str = "") -> Owned | None:
    """``Owned`` if ``labels`` make the object ``worker``'s (see the module), else ``None``.
    Empty label values count as absent."""
    labels = labels or {}
    if labels.get(WORKER_LABEL) != worker:
        return None
    handle = labels.get(HANDLE_LABEL) or None
    task = labels.get(TASK_LABEL) or None
    if handle is None and task is None:
        return None
    return Owned(ref, handle, task, state)


def labels_for(worker: str, handle: str | None = None, task: str | None = None) -> dict[str, str]:
    """The labels that make a new object ``worker``'s, with its handle and task if given."""
    out = {WORKER_LABEL: worker}
    if handle is not None:
        out[HANDLE_LABEL] = handle
    if task is not None:
        out[TASK_LABEL] = task
    return out
