"""Table tests of the collection policy: what a report marks and clears, and when a handle is
destroyed (CONTRACT.md §4 rules 1-4). Times are seconds after T0; durations seconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reaper.core.contract import WorkerState
from reaper.core.policy.collection import (
    carries_also_seen,
    coalesce,
    destroy_after,
    destroy_cutoff,
    destroy_refused,
    destroy_retry_due,
    is_due,
    mass_drop_held,
    next_due,
    recheck_at,
    report_decides,
    should_forward,
    superseded_chunks,
)
from tests.support.rule_models import RowVerdict, may_destroy, row_verdict, stuck_creating

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
TTL = 300
R, S, L = WorkerState.running, WorkerState.stalled, WorkerState.lost


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# When is a handle destroyed? One row per case, read left to right:
# kind, row state, marked at, report taken at, worker state, fleet full -> destroyed?
WHEN_DESTROYED = [
    ("volumes", "created", 0, 300, R, False, True),  # missing for exactly the TTL
    ("volumes", "created", 0, 299, R, False, False),  # one second short
    ("volumes", "destroying", 0, 600, R, False, True),
    ("containers", "created", 0, 900, R, False, True),
    ("containers", "creating", 0, 900, R, False, False),  # rule 2: creating never
    ("containers", "created", None, 900, R, False, False),  # not marked
    ("volumes", "created", 0, 900, S, False, False),  # rule 4: stalled worker
    ("volumes", "created", 0, 900, L, False, False),  # rule 4: lost worker
    ("volumes", "created", 0, 900, None, False, False),  # unknown worker
    ("volumes", "created", 0, 900, R, True, False),  # rule 6: full disruption
    ("tasks", "running", 0, 300, R, False, True),  # a task: stopped, missing
    ("tasks", "pending", 0, 900, R, False, False),  # never started: never marked
    ("tasks", "lost", 0, 900, R, False, False),  # already reaped
]


@pytest.mark.parametrize("kind, state, marked, taken, worker, full, destroyed", WHEN_DESTROYED)
def test_when_a_handle_is_destroyed(kind, state, marked, taken, worker, full, destroyed):
    mark = at(marked) if marked is not None else None
    assert may_destroy(kind, state, mark, at(taken), TTL, worker, full) is destroyed


# What does a deciding report do to one row? kind, row state, state changed at, marked,
# in report, report taken at -> verdict
ROW_VERDICTS = [
    ("volumes", "created", 0, False, False, 10, RowVerdict.mark),
    ("volumes", "destroying", 0, False, False, 10, RowVerdict.mark),
    ("volumes", "creating", 0, False, False, 10, RowVerdict.keep),  # rule 2
    ("volumes", "created", 11, False, False, 10, RowVerdict.keep),  # changed after the report
    ("volumes", "created", 10, False, False, 10, RowVerdict.mark),  # changed at the same time
    ("volumes", "created", 0, True, False, 10, RowVerdict.keep),  # rule 3: already marked
    ("volumes", "created", 0, True, True, 10, RowVerdict.clear),  # reappeared
    ("volumes", "created", 0, False, True, 10, RowVerdict.keep),  # rule 3: nothing to write
    ("tasks", "running", 0, False, False, 10, RowVerdict.mark),
    ("tasks", "pending", 0, False, False, 10, RowVerdict.keep),
    ("tasks", "stopped", 0, False, False, 10, RowVerdict.keep),
]


@pytest.mark.parametrize("kind, state, changed, marked, in_report, taken, verdict", ROW_VERDICTS)
def test_what_a_report_does_to_a_row(kind, state, changed, marked, in_report, taken, verdict):
    assert row_verdict(kind, state, at(changed), marked, in_report, at(taken)) is verdict


@pytest.mark.parametrize(
    "worker, since, taken, decides",
    [
        (R, 0, 10, True),
        (R, None, 10, True),
        (R, 10, 10, True),  # taken at the return itself
        (R, 11, 10, False),  # rule 4: taken before the return
        (S, 0, 10, False),  # rule 1
        (L, 0, 10, False),  # rule 1
        (None, None, 10, False),
        ("running", 0, 10, True),  # as read from Postgres
    ],
)
def test_only_a_running_workers_report_since_its_return_decides(worker, since, taken, decides):
    skipped = report_decides(worker, at(since) if since is not None else None, at(taken))
    assert (skipped is None) is decides


@pytest.mark.parametrize(
    "newly_missing, held, confirmed, held_back",
    [
        (5, 10, False, False),  # exactly half: believed
        (6, 10, False, True),  # more than half: held until confirmed
        (6, 10, True, False),  # confirmed by a second report or a reboot
        (9, 9, False, False),  # below the minimum holding: never held
        (100, 100, False, True),
        (0, 100, False, False),
    ],
)
def test_mass_drop_is_held_until_confirmed(newly_missing, held, confirmed, held_back):
    assert mass_drop_held(newly_missing, held, 0.5, 10, confirmed) is held_back


@pytest.mark.parametrize(
    "worker, full, refused",
    [
        (R, False, None),
        ("running", False, None),
        (S, False, "worker is stalled"),
        (L, False, "worker is lost"),
        (None, False, "worker is unknown"),
        (R, True, "fleet in full disruption"),
    ],
)
def test_destroy_refused_on_stalled_lost_or_disrupted(worker, full, refused):
    assert destroy_refused(worker, full) == refused


@pytest.mark.parametrize(
    "due, taken, result",
    [(None, 100, False), (300, 299, False), (300, 300, True), (300, 301, True)],
)
def test_a_kind_is_due_once_its_oldest_mark_is(due, taken, result):
    assert is_due(at(due) if due is not None else None, at(taken)) is result


@pytest.mark.parametrize(
    "due, orphan, result",
    [
        (None, None, None),  # nothing marked, nothing unknown: no timer
        (300, None, 300),  # a mark falls due
        (None, 200, 200),  # an unknown handle becomes an orphan
        (300, 200, 200),  # whichever comes first
        (100, 200, 100),
    ],
)
def test_a_fresh_report_is_needed_when_a_mark_or_an_orphan_falls_due(due, orphan, result):
    got = recheck_at(at(due) if due is not None else None, at(orphan) if orphan else None)
    assert got == (at(result) if result is not None else None)


def test_next_due_is_the_oldest_mark_plus_the_ttl():
    assert next_due("volumes", None, TTL) is None
    assert next_due("volumes", at(5), TTL) == at(305)


@pytest.mark.parametrize(
    "state, changed, now, full, collected",
    [
        ("creating", 0, 3600, False, True),
        ("creating", 0, 3599, False, False),
        ("created", 0, 9999, False, False),
        ("creating", 0, 9999, True, False),
    ],
)
def test_rows_stuck_in_creating_are_collected(state, changed, now, full, collected):
    assert stuck_creating(state, at(changed), at(now), 3600, full) is collected


@pytest.mark.parametrize(
    "digest, fwd, taken, fwd_at, wanted, expected",
    [
        ("x", None, 0, None, False, (True, "changed")),
        ("y", "x", 10, 0, False, (True, "changed")),
        ("x", "x", 10, 0, False, (False, "unchanged")),
        ("x", "x", 10, 0, True, (True, "due")),
        ("x", "x", 30, 0, False, (True, "resync")),
    ],
)
def test_which_reports_are_reconciled(digest, fwd, taken, fwd_at, wanted, expected):
    d = should_forward(
        digest, fwd, at(taken), at(fwd_at) if fwd_at is not None else None, 30, wanted
    )
    assert (d.forward, d.reason) == expected


@pytest.mark.parametrize(
    "count, size, carried",
    [
        (0, 1, True),
        (1_000, 40, True),  # ~43 KiB
        (1_500, 40, True),  # ~64.5 KiB: just under
        (1_600, 40, False),  # ~67 KiB: every mark restarts instead
        (4, 500_000 // 4, False),  # a burst of huge reports
    ],
)
def test_when_superseded_handles_are_carried_or_every_mark_restarts(count, size, carried):
    also_seen = [f"{i:0{size}d}" for i in range(count)]
    assert carries_also_seen(also_seen) is carried


def test_coalesce_keeps_handles_seen_in_superseded_reports():
    assert coalesce(["a", "b"], [], ["a"]) == ["b"]
    assert coalesce(["a"], ["z"], ["a"]) == ["z"]
    assert coalesce(["a"], ["z"], ["z", "a"]) == []


def test_only_the_newest_queued_report_of_each_kind_is_staged() -> None:
    queued = [
        ("containers", "a"),
        ("containers", "a"),
        ("volumes", "v"),
        ("containers", "b"),  # b supersedes a, complete or not
        ("volumes", "v"),
        ("containers", "b"),
    ]
    assert superseded_chunks(queued) == [True, True, False, False, False, False]
    assert superseded_chunks([("tasks", "t"), ("tasks", "t")]) == [False, False]
    assert superseded_chunks([]) == []
    # a report the queue returns to is the newest again (the last queued chunk decides)
    assert superseded_chunks([("containers", "a"), ("containers", "b"), ("containers", "a")]) == [
        False,
        True,
        False,
    ]


@pytest.mark.parametrize(
    ("kind", "waits"),
    [("containers", 300.0), ("container", 300.0), ("volumes", 300.0), ("tasks", 300.0)],
)
def test_every_kind_waits_missing_ttl(kind, waits):
    """Rule 4: one MISSING_TTL for every kind (``reaper.core.kinds``: ``ttl_multiple`` 1);
    a report key or a word names the kind."""
    assert destroy_after(kind, 300.0) == waits
    assert next_due(kind, T0, 300.0) == T0 + timedelta(seconds=waits)


def test_a_kind_that_waits_longer_waits_longer_everywhere(monkeypatch):
    """What one row's ``ttl_multiple`` changes: the wait, the cutoff and the due time."""
    from reaper.core import kinds

    longer = kinds.Kind("volumes", "volume", "reaper.volumes", ttl_multiple=2.0)
    monkeypatch.setitem(kinds._BY_NAME, "volumes", longer)
    assert destroy_after("volumes", 300.0) == 600.0
    assert destroy_cutoff("volumes", T0, 300.0) == T0 - timedelta(seconds=600)
    assert next_due("volumes", T0, 300.0) == T0 + timedelta(seconds=600)
    assert destroy_after("containers", 300.0) == 300.0


@pytest.mark.parametrize(
    ("due_in", "refused_in", "again_in"),
    [
        (0, 10, 40),  # due now, refused 10 s on: STALL_AFTER (30) after the refusal
        (0, 0, 30),
        (100, 0, 100),  # its own due time is later: kept
    ],
)
def test_a_refused_destroy_is_looked_at_again_after_stall_after(due_in, refused_in, again_in):
    due, refused = T0 + timedelta(seconds=due_in), T0 + timedelta(seconds=refused_in)
    assert destroy_retry_due(due, refused, 30.0) == T0 + timedelta(seconds=again_in)
