"""This controller's counters and histograms (CONTRACT.md §5.4), in prometheus-client's
default registry; ``reaper.infra.metrics_endpoint`` serves them with the fleet's gauges.

Counters count what this process did: a destroy or a reap is counted after its transaction
committed, by the rows it changed (a retried activity that finds nothing left counts 0), and
never in a dry run. Workflow code may call :func:`count_rejected` only when not replaying.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from prometheus_client import Counter, Histogram, Info

from activities.types import ReconcileInput
from reaper import __version__
from reaper.core import kinds

BUILD = Info("reaper_build", "The reaper release this controller runs (CHANGELOG.md).")
BUILD.info({"version": __version__})

DESTROYED = Counter(
    "reaper_destroyed",
    "Rows destroyed by this controller: containers and volumes deleted, tasks stopped as"
    " missing (missing as long as their kind waits, stuck creating, or a retired worker's"
    " rows).",
    ["kind"],
)
TASKS_REAPED = Counter(
    "reaper_tasks_reaped",
    "Tasks taken down (made lost) by reaps of this controller: lost, forced, retired, strays.",
)
HEARTBEATS_REJECTED = Counter(
    "reaper_heartbeats_rejected",
    "Heartbeats and operator signals rejected by this controller's liveness workflows"
    " (malformed, sent to another worker's liveness, force_reap before any beat).",
)
SIGNALS_IGNORED = Counter(
    "reaper_signals_ignored",
    "Input this controller's workflows ignored without failing a task (workflows/front_door.py):"
    " arguments beyond a handler's first, signals of unknown names, internal signals that did"
    " not parse, start inputs that did not parse. By workflow type and why.",
    ["workflow_type", "why"],
)
LIVENESSES_REPAIRED = Counter(
    "reaper_livenesses_repaired",
    "Stuck liveness workflows (a history the code cannot replay) reset by this controller to"
    " the latest workflow task that replays (activities/repair.py).",
)
LIVENESSES_UNREPAIRABLE = Counter(
    "reaper_livenesses_unrepairable",
    "Checks of this controller that found a stuck liveness and could not reset it (no"
    " replayable reset point, or a failure other than a nondeterminism); rises at every check"
    " while one stays stuck.",
)
MIGRATIONS = Counter(
    "reaper_migrations",
    "Tasks of migrating drains that ended, by outcome (CONTRACT.md §6.2): replaced (the"
    " original stopped after its replacement ran), deadline (stopped at the drain's deadline),"
    " cancelled (its replacement stopped by an undrain before it ran).",
    ["outcome"],
)
MIGRATION_OUTCOMES = ("replaced", "deadline", "cancelled")
RECONCILE_SECONDS = Histogram(
    "reaper_reconcile_duration_seconds",
    "Time to diff one complete report against Postgres (reconcile_report activity), by kind.",
    ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
for _kind in kinds.WORDS:  # every kind shows from the first scrape, at 0
    DESTROYED.labels(_kind)
    RECONCILE_SECONDS.labels(_kind)
for _outcome in MIGRATION_OUTCOMES:
    MIGRATIONS.labels(_outcome)


def count_destroyed(kind: str, rows: int) -> None:
    """Count ``rows`` destroyed of ``kind`` (a report kind ``containers`` or an event kind
    ``container``); call after the transaction committed, never in a dry run."""
    if rows > 0:
        DESTROYED.labels(kinds.kind(kind).word).inc(rows)


def count_migrations(outcome: str, tasks: int) -> None:
    """Count ``tasks`` of migrating drains that ended with ``outcome`` (one of
    :data:`MIGRATION_OUTCOMES`); call after the transaction committed, never in a dry run."""
    if tasks > 0:
        MIGRATIONS.labels(outcome).inc(tasks)


def count_reaped(tasks: int) -> None:
    """Count ``tasks`` taken down by a reap, after its transaction committed."""
    if tasks > 0:
        TASKS_REAPED.inc(tasks)


def count_repaired(livenesses: int) -> None:
    """Count ``livenesses`` reset by a repair, after the reset and its row committed."""
    if livenesses > 0:
        LIVENESSES_REPAIRED.inc(livenesses)


def count_unrepairable(livenesses: int) -> None:
    """Count ``livenesses`` found stuck and left alone by one repair check."""
    if livenesses > 0:
        LIVENESSES_UNREPAIRABLE.inc(livenesses)


def count_rejected() -> None:
    """Count one rejected heartbeat or signal. Workflow code calls it only when
    ``not workflow.unsafe.is_replaying()``, so a replay never counts a rejection twice."""
    HEARTBEATS_REJECTED.inc()


def count_ignored(workflow_type: str, why: str) -> None:
    """Count one ignored input of a workflow of ``workflow_type`` (``why``: extra-arguments,
    unknown-signal, malformed, malformed-start). Workflow code calls it only when not
    replaying. Both labels are bounded: reaper's four workflow types, four reasons."""
    SIGNALS_IGNORED.labels(workflow_type, why).inc()


S = TypeVar("S")
R = TypeVar("R")


def timed_reconcile(
    fn: Callable[[S, ReconcileInput], Coroutine[Any, Any, R]],
) -> Callable[[S, ReconcileInput], Coroutine[Any, Any, R]]:
    """Decorate the ``reconcile_report`` activity: its duration (seconds, failures included)
    goes to ``reaper_reconcile_duration_seconds{kind}``. Put it under ``@activity.defn``."""

    @functools.wraps(fn)
    async def timed(self: S, inp: ReconcileInput) -> R:
        start = time.perf_counter()
        try:
            return await fn(self, inp)
        finally:
            elapsed = time.perf_counter() - start
            RECONCILE_SECONDS.labels(kinds.kind(inp.kind).word).observe(elapsed)

    return timed
