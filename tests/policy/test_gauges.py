"""Table tests of the fleet's gauges (CONTRACT.md §5.4): counts by state, the disruption
level by rule 6, heartbeat lags. Times are seconds after T0."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reaper.core.policy.gauges import WorkerRow, fleet_gauges

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def rows(*states: str) -> list[WorkerRow]:
    """One worker per state, ``w0``, ``w1``, ..., each last beating at T0."""
    return [WorkerRow(f"w{i}", s, T0) for i, s in enumerate(states)]


@pytest.mark.parametrize(
    "states, threshold, workers, disruption",
    [
        ((), 0.55, (0, 0, 0), 0),  # an empty fleet is normal
        (("running", "running"), 0.55, (2, 0, 0), 0),
        (("running", "stalled"), 0.55, (1, 1, 0), 1),  # half unhealthy: below 0.55
        (("running", "lost"), 0.5, (1, 0, 1), 2),  # at the threshold: full
        (("stalled", "lost", "running"), 0.55, (1, 1, 1), 2),
        (("retired", "retired", "running"), 0.55, (1, 0, 0), 0),  # retired count nowhere
        (("retired", "lost", "running", "running"), 0.55, (2, 0, 1), 1),
        (("lost",), 1.0, (0, 0, 1), 2),
    ],
)
def test_counts_and_disruption(states, threshold, workers, disruption):
    g = fleet_gauges(rows(*states), owed=0, threshold=threshold, now=at(10), resync_interval=30)
    assert (g.workers["running"], g.workers["stalled"], g.workers["lost"]) == workers
    assert set(g.workers) == {"running", "stalled", "lost"}
    assert g.disruption == disruption


@pytest.mark.parametrize(
    "beats, now, lag_max",
    [
        # (state, last heartbeat in seconds after T0 or None)
        ([("running", 0), ("running", 8)], 10, {"running": 10.0}),
        (
            [("running", 9), ("stalled", 0), ("lost", -300)],
            10,
            {"running": 1, "stalled": 10, "lost": 310},
        ),
        ([("running", None)], 10, {}),  # never beat: no lag
        ([("running", 12)], 10, {"running": 0.0}),  # a beat ahead of the clock: lag 0
        ([("retired", 0)], 10, {}),
    ],
)
def test_heartbeat_lag(beats, now, lag_max):
    workers = [
        WorkerRow(f"w{i}", s, None if t is None else at(t)) for i, (s, t) in enumerate(beats)
    ]
    g = fleet_gauges(workers, owed=0, threshold=0.55, now=at(now), resync_interval=30)
    assert g.lag_max == pytest.approx(lag_max)


def test_last_heartbeat_per_counted_worker_and_owed_passed_through():
    workers = [
        WorkerRow("a", "running", at(5)),
        WorkerRow("b", "lost", None),
        WorkerRow("c", "retired", at(1)),
    ]
    g = fleet_gauges(workers, owed=3, threshold=0.55, now=at(10), resync_interval=30)
    assert g.last_heartbeat == {"a": at(5).timestamp()}
    assert g.owed == 3


def test_drained_workers_are_counted_from_a_single_pass_over_the_rows():
    """``reaper_workers_drained`` (CONTRACT.md §6.2); a retired worker counts nowhere, and the
    rows may be a generator (read once)."""
    rows = (
        WorkerRow(n, s, T0, d)
        for n, s, d in (("a", "running", True), ("b", "running", False), ("c", "retired", True))
    )
    g = fleet_gauges(rows, 0, 0.55, T0, resync_interval=30)
    assert g.drained == 1 and g.workers["running"] == 2


def test_reports_incomplete_counts_running_workers_beating_without_complete_reports():
    every = {"containers": at(0), "volumes": at(0), "tasks": at(0)}
    workers = [
        WorkerRow("fresh", "running", at(10), complete_at={k: at(10) for k in every}),
        WorkerRow(
            "engine-down", "running", at(100), complete_at=every
        ),  # beats, reports 100 s behind
        WorkerRow("no-volumes", "running", at(100), complete_at={**every, "volumes": None}),
        WorkerRow(
            "stalled", "stalled", at(0), complete_at=every
        ),  # silent: not beating without reports
        WorkerRow("lost", "lost", at(0)),
        WorkerRow("retired", "retired", at(100)),
        WorkerRow("never-beat", "running", None),
    ]
    g = fleet_gauges(workers, owed=0, threshold=0.55, now=at(100), resync_interval=30)
    assert g.reports_incomplete == 2
