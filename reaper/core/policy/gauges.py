"""The fleet's gauges (CONTRACT.md §5.4), from the ``workers`` rows as Postgres holds them.

Every controller replica computes them from the same rows, so they read the same on each.
Pure: rows and a clock in, numbers out; the I/O is ``activities.metrics``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from reaper.core.policy.fleet import FleetState, fleet_state
from reaper.core.policy.reports import liveness_only
from reaper.core.states import HEALTHY, IN_FLEET, UNHEALTHY

WORKER_STATES = tuple(IN_FLEET)
"""States counted by ``reaper_workers{state}`` (``reaper.core.states``: ``in_fleet``)."""

DISRUPTION_LEVEL = {FleetState.normal: 0, FleetState.partial: 1, FleetState.full: 2}
"""``reaper_fleet_disruption``: 0 none stalled or lost, 1 some (below the threshold), 2 at or
above it (rule 6 holds reaps)."""


@dataclass(frozen=True)
class WorkerRow:
    """One ``reaper.workers`` row: name, state, last heartbeat (UTC, ``None`` if never), and
    per kind its last complete report (``workers.<kind>_complete_at``; a kind left out:
    none)."""

    name: str
    state: str
    last_heartbeat_at: datetime | None
    drained: bool = False
    """Draining and holding no pending or running task (CONTRACT.md §6.2)."""
    complete_at: Mapping[str, datetime | None] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetGauges:
    """The fleet's gauges at one moment.

    Attributes:
        workers: ``state -> count`` for every state of :data:`WORKER_STATES` (zeros kept).
        disruption: :data:`DISRUPTION_LEVEL` of the fleet's state.
        owed: owed replacements (``pending`` tasks with no worker, §5.1).
        lag_max: ``state -> seconds`` since the stalest last heartbeat among workers in that
            state; states with no worker that ever beat are absent.
        last_heartbeat: ``worker -> last heartbeat`` as a Unix time in seconds, for every
            counted worker that ever beat.
        drained: drained workers (§6.2, ``reaper_workers_drained``).
        reports_incomplete: workers whose beats have carried no complete report of some
            kind for longer than ``RESYNC_INTERVAL`` (``policy.reports.liveness_only``).
    """

    workers: dict[str, int]
    disruption: int
    owed: int
    lag_max: dict[str, float] = field(default_factory=dict)
    last_heartbeat: dict[str, float] = field(default_factory=dict)
    drained: int = 0
    reports_incomplete: int = 0


def fleet_gauges(
    rows: Iterable[WorkerRow],
    owed: int,
    threshold: float,
    now: datetime,
    resync_interval: float,
) -> FleetGauges:
    """The gauges of a fleet from its ``workers`` rows.

    The disruption level is rule 6's (``policy.fleet.fleet_state``) over the same counts.
    Rows in a state outside :data:`WORKER_STATES` (``retired``) count nowhere. A last heartbeat
    later than ``now`` (clock skew between replicas) counts as a lag of 0.

    Args:
        rows: the ``workers`` rows, any order.
        owed: owed replacements counted in Postgres.
        threshold: ``REAPER_DISRUPTION_THRESHOLD``, a fraction in (0, 1].
        now: the clock the lags are measured against (UTC; Postgres' ``now()`` on a read).
        resync_interval: ``REAPER_RESYNC_INTERVAL``, seconds: how long a worker's beats may
            carry no complete report of a kind before it counts in ``reports_incomplete``.
    """
    workers = dict.fromkeys(WORKER_STATES, 0)
    lag_max: dict[str, float] = {}
    last: dict[str, float] = {}
    drained = 0
    incomplete = 0
    for row in rows:
        if row.state not in workers:
            continue
        workers[row.state] += 1
        drained += row.drained
        if liveness_only(row.state, row.last_heartbeat_at, row.complete_at, resync_interval):
            incomplete += 1
        if row.last_heartbeat_at is None:
            continue
        lag = max((now - row.last_heartbeat_at).total_seconds(), 0.0)
        lag_max[row.state] = max(lag_max.get(row.state, 0.0), lag)
        last[row.name] = row.last_heartbeat_at.timestamp()
    healthy = sum(workers[s] for s in HEALTHY)
    unhealthy = sum(workers[s] for s in UNHEALTHY)
    level = DISRUPTION_LEVEL[fleet_state(healthy, unhealthy, threshold)]
    return FleetGauges(workers, level, owed, lag_max, last, drained, incomplete)
