"""Table tests of the fleet policy: disruption states and whether a worker may be reaped
(CONTRACT.md rules 5 and 6). Times are seconds after T0; durations seconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reaper.core import states
from reaper.core.policy.fleet import (
    Bucket,
    FleetState,
    fleet_state,
    may_reap,
    may_retire,
    retire_due,
    retire_is_stale,
    take_reap_token,
)
from tests.support.rule_models import is_stray

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
N, P, F = FleetState.normal, FleetState.partial, FleetState.full


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "healthy, unhealthy, threshold, expected",
    [
        (0, 0, 0.55, N),
        (10, 0, 0.55, N),
        (9, 1, 0.55, P),
        (5, 5, 0.55, P),
        (45, 55, 0.55, F),  # at the threshold: full
        (0, 3, 0.55, F),
        (2, 1, 0.3, F),
        (1, 1, 1.0, P),
        (0, 1, 1.0, F),
    ],
)
def test_fleet_state(healthy, unhealthy, threshold, expected):
    assert fleet_state(healthy, unhealthy, threshold) is expected


# May this worker be reaped now? forced, worker state, fleet, recovered at, last beat, now
# -> (allowed, refused, retry at)
MAY_REAP = [
    (False, "lost", N, None, 0, 400, (True, None, None)),
    (False, "lost", P, None, 0, 400, (True, None, None)),
    (False, "lost", F, None, 0, 400, (False, "fleet in full disruption", None)),
    (False, "stalled", N, None, 0, 400, (False, "worker is stalled, not lost", None)),
    (False, "running", N, None, 0, 400, (False, "worker is running, not lost", None)),
    (False, None, N, None, 0, 400, (False, "unknown worker", None)),
    # after a recovery at 100, a worker silent since before it gets a fresh LOST_AFTER
    (False, "lost", N, 100, 0, 399, (False, "fleet recovering: fresh LOST_AFTER", 400)),
    (False, "lost", N, 100, 0, 400, (True, None, None)),
    (False, "lost", P, 100, 150, 400, (True, None, None)),  # beat after the recovery
    (True, "running", F, None, 0, 1, (True, None, None)),  # forced: no guard
    (True, "lost", N, 100, 0, 101, (True, None, None)),
    (True, None, N, None, None, 1, (False, "unknown worker", None)),
]


@pytest.mark.parametrize("forced, state, fleet, recovered, last, now, expected", MAY_REAP)
def test_when_a_worker_may_be_reaped(forced, state, fleet, recovered, last, now, expected):
    verdict = may_reap(
        forced,
        state,
        fleet,
        at(recovered) if recovered is not None else None,
        at(last) if last is not None else None,
        at(now),
        300,
    )
    retry = at(expected[2]) if expected[2] is not None else None
    assert (verdict.allowed, verdict.refused, verdict.retry_at) == (*expected[:2], retry)


@pytest.mark.parametrize("forced", [False, True])
def test_a_state_that_is_never_reaped_is_refused_forced_or_not(monkeypatch, forced):
    """``states.WorkerMeaning.reapable`` False: may_reap refuses, whoever asks (issue 33: a
    new state's reap rule is its row in the states table)."""
    monkeypatch.setattr(states, "NEVER_REAPED", ["lost"])
    verdict = may_reap(forced, "lost", N, None, at(0), at(400), 300)
    assert (verdict.allowed, verdict.refused) == (False, "worker is lost: never reaped")


@pytest.mark.parametrize(
    "bucket, now, taken, retry",
    [
        (None, 0, Bucket(9.0, at(0)), None),  # a new bucket is full
        (Bucket(1.0, at(0)), 0, Bucket(0.0, at(0)), None),
        (Bucket(0.0, at(0)), 0, None, 1),  # empty: retry in 1/rate s
        (Bucket(0.5, at(0)), 0, None, 0.5),
        (Bucket(0.0, at(0)), 3, Bucket(2.0, at(3)), None),  # refilled at 1/s
        (Bucket(0.0, at(0)), 100, Bucket(9.0, at(100)), None),  # never above the burst
    ],
)
def test_reaps_are_rate_limited(bucket, now, taken, retry):
    got, retry_at = take_reap_token(bucket, at(now), 1.0, 10)
    assert got == taken
    assert retry_at == (at(retry) if retry is not None else None)


# May this worker be retired now? automatic, state, reap done, state since, fleet, now
# -> (allowed, refused, retry at). RETIRE_AFTER is 1000 s here.
MAY_RETIRE = [
    (False, "running", False, 0, N, 1, (True, None, None)),  # operator or agent: at once
    (False, "lost", False, 0, F, 1, (True, None, None)),  # no disruption guard
    (False, "retired", True, 0, N, 1, (False, "already retired", None)),
    (False, None, False, None, N, 1, (False, "unknown worker", None)),
    (True, "lost", True, 0, N, 1000, (True, None, None)),  # lost for RETIRE_AFTER
    (True, "lost", True, 0, N, 999, (False, "not lost for RETIRE_AFTER yet", 1000)),
    (True, "lost", False, 0, N, 5000, (False, "worker is lost, not lost and reaped", None)),
    (True, "lost", True, 0, F, 5000, (False, "fleet in full disruption", None)),
    (True, "stalled", True, 0, N, 5000, (False, "worker is stalled, not lost and reaped", None)),
    (True, "retired", True, 0, N, 5000, (False, "already retired", None)),
]


@pytest.mark.parametrize("automatic, state, reaped, since, fleet, now, expected", MAY_RETIRE)
def test_when_a_worker_may_be_retired(automatic, state, reaped, since, fleet, now, expected):
    verdict = may_retire(
        automatic, state, reaped, at(since) if since is not None else None, fleet, at(now), 1000
    )
    retry = at(expected[2]) if expected[2] is not None else None
    assert (verdict.allowed, verdict.refused, verdict.retry_at) == (*expected[:2], retry)


@pytest.mark.parametrize(
    "task, worker, reaped, fleet, stray",
    [
        ("running", "retired", False, N, True),
        ("pending", "retired", False, P, True),
        ("running", "lost", True, N, True),  # written after the reap (Kubernetes #12545)
        ("running", "lost", False, N, False),  # the reap itself will take it
        ("running", "stalled", True, N, False),
        ("running", "running", True, N, False),
        ("lost", "retired", True, N, False),
        ("running", "retired", True, F, False),  # rule 6: not in full disruption
        ("running", None, False, N, False),
    ],
)
def test_stray_tasks_on_lost_or_retired_workers(task, worker, reaped, fleet, stray):
    assert is_stray(task, worker, reaped, fleet) is stray


def test_retire_due_counts_from_state_since():
    assert retire_due(at(100), 86400) == at(86500)


@pytest.mark.parametrize(
    "retire_boot, current_boot, stale",
    [
        (None, "b2", False),  # an operator's retire names no boot: it acts
        ("b2", "b2", False),  # the agent retires the boot it runs
        ("b1", "b2", True),  # delivered after the host restarted as b2: ignored
        ("b1", None, True),  # a boot this liveness never heard of
    ],
)
def test_a_retire_for_a_boot_that_is_gone_is_ignored(retire_boot, current_boot, stale):
    assert retire_is_stale(retire_boot, current_boot) is stale
