"""Every kind of handle a worker reports, declared once: its report key, its table, the word
its events and metrics use, whether it is a task, how long it waits.

Everything that handles "each kind" reads this table: the heartbeat's lists
(``reaper.core.contract.KINDS``), the SQL maps (``activities.base.per_kind``), the state
sets a report may mark (``reaper.core.states.MARKABLE``), when a missing one is destroyed
(``reaper.core.policy.collection.destroy_after``), the metrics' ``kind`` label, the CLI's
``KIND`` arguments, the agent runtimes and the chaos campaign. Concourse keeps one collector
per kind with its own grace period (``atc/gc``: ``missingContainerGracePeriod``,
``missingVolumeGracePeriod``); here a kind is a row. Adding one is a row here, its field in
the heartbeat (``contract.Heartbeat``), a migration for its table, and its listing in an
agent runtime.

Pure: imports nothing of reaper's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Kind:
    """One kind of handle.

    Attributes:
        report: the heartbeat's key for the complete list of this kind (CONTRACT.md §2),
            also the name the workflows, the collector and ``reaper.unknown_handles`` use.
        word: the singular the ``events.kind`` column, the metrics' ``kind`` label and the
            CLI's ``KIND`` arguments use (CONTRACT.md §3, §5.4).
        table: the table of its rows (a fixed identifier, never input).
        key: the column of ``table`` that holds the handle.
        task: a task (CONTRACT.md rules 4, 5, 7): a missing one is stopped
            (``stop_reason`` missing) and its service backfilled instead of its row
            deleted; a placed one starts when its worker reports it; a reported one that
            is over is an orphan; it has no ``creating`` state.
        ttl_multiple: a missing handle is destroyed after this many ``MISSING_TTL``
            (``policy.collection.destroy_after``; 1 for every kind, as the contract says).
    """

    report: str
    word: str
    table: str
    key: str = "handle"
    task: bool = False
    ttl_multiple: float = 1.0

    @property
    def destroyed(self) -> str:
        """The ``events.action`` of a destroy (CONTRACT.md §3): ``destroyed`` (the row
        deleted), ``stopped`` for a task."""
        return "stopped" if self.task else "destroyed"

    @property
    def complete_column(self) -> str:
        """The ``workers`` column holding the worker's last complete report of this kind
        (UTC; ``policy.reports``): ``<report>_complete_at``, a fixed identifier."""
        return f"{self.report}_complete_at"


CONTAINERS = Kind("containers", "container", "reaper.containers")
VOLUMES = Kind("volumes", "volume", "reaper.volumes")
TASKS = Kind("tasks", "task", "reaper.tasks", key="id", task=True)

ALL: tuple[Kind, ...] = (CONTAINERS, VOLUMES, TASKS)
"""Every kind, in the order reports, tables and listings show them."""
REPORTS: tuple[str, ...] = tuple(k.report for k in ALL)
"""The heartbeat's keys, ``("containers", "volumes", "tasks")``."""
WORDS: tuple[str, ...] = tuple(k.word for k in ALL)
"""The events' and metrics' words, ``("container", "volume", "task")``."""
HANDLE_ROWS: tuple[Kind, ...] = tuple(k for k in ALL if not k.task)
"""The kinds whose rows a destroy deletes (containers and volumes): their rows have the
``creating`` state and are deleted by a retirement (§5.1)."""

TASK_ROWS: tuple[Kind, ...] = tuple(k for k in ALL if k.task)
"""The kinds a destroy stops instead of deleting (tasks)."""

COMPLETE_COLUMNS: str = ", ".join(k.complete_column for k in ALL)
"""The ``workers`` columns of each kind's last complete report, in ``ALL`` order, for a
``SELECT`` list (``containers_complete_at, volumes_complete_at, tasks_complete_at``)."""


def spoken(*words: str, last: str = "or") -> str:
    """Words as a phrase for help and error texts: ``spoken("worker", *WORDS)`` is
    ``worker, container, volume or task``."""
    return words[0] if len(words) < 2 else f"{', '.join(words[:-1])} {last} {words[-1]}"


def complete_times(row: Mapping[str, Any]) -> dict[str, Any]:
    """Each kind's last complete report from a ``workers`` row read with
    :data:`COMPLETE_COLUMNS`, keyed by report kind (``{"containers": datetime | None, ...}``).
    Raises ``KeyError`` if the row lacks a column."""
    return {k.report: row[k.complete_column] for k in ALL}


_BY_NAME = {**{k.report: k for k in ALL}, **{k.word: k for k in ALL}}


def kind(name: str) -> Kind:
    """The kind named ``name``, its report key (``containers``) or its word (``container``).

    Raises:
        KeyError: no kind has that name.
    """
    return _BY_NAME[name]


def known(name: str) -> bool:
    """Whether ``name`` names a kind (its report key or its word)."""
    return name in _BY_NAME
