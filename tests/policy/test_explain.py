"""``reaper explain``'s answers, as tables: for each case, the rule named and the next due
time, which must be the time the controller's own rules give (``policy.liveness``,
``policy.fleet``, ``policy.collection``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reaper.core.models import Timings
from reaper.core.policy.explain import FleetFacts, RowFacts, WorkerFacts, explain_worker
from reaper.core.policy.explain_rows import explain_gone, explain_row
from tests.support.controller import make_settings

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
T = Timings.of(
    make_settings(
        heartbeat_interval=10,
        stall_after=30,
        lost_after=300,
        missing_ttl=300,
        creating_timeout=3600,
        retire_after=86_400,
    )
)
NORMAL = FleetFacts("normal", 9, 0)
PARTIAL = FleetFacts("partial", 5, 4)
FULL = FleetFacts("full", 4, 5)


def ago(s: float) -> datetime:
    return NOW - timedelta(seconds=s)


def after(s: float) -> datetime:
    return NOW + timedelta(seconds=s)


@pytest.mark.parametrize(
    ("worker", "fleet", "next_words", "due", "note"),
    [
        (WorkerFacts("w", "running", ago(60), ago(4)), NORMAL, "stalled at", after(26), None),
        (
            WorkerFacts("w", "stalled", ago(10), ago(40)),
            PARTIAL,
            "lost at",
            after(260),
            "4 of 9 unhealthy",
        ),
        (
            WorkerFacts("w", "stalled", ago(10), ago(40)),
            FULL,
            "lost at",
            after(260),
            "reap held: fleet in full disruption, 5 of 9 unhealthy",
        ),
        (
            WorkerFacts("w", "lost", ago(100), ago(400), reaped_at=ago(99)),
            NORMAL,
            "retired automatically at",
            ago(100) + timedelta(seconds=86_400),
            "its tasks were reaped",
        ),
        (
            WorkerFacts("w", "lost", ago(100), ago(400)),
            FULL,
            "reap held: fleet in full disruption",
            None,
            None,
        ),
        (
            WorkerFacts("w", "lost", ago(100), ago(400)),
            FleetFacts("partial", 8, 1, recovered_at=ago(60)),
            "reap held: fleet recovering: fresh LOST_AFTER",
            after(240),
            None,
        ),
        (WorkerFacts("w", "retired", ago(5), ago(999)), NORMAL, "registers it afresh", None, None),
    ],
)
def test_a_worker_is_explained_by_the_rule_that_holds_it(worker, fleet, next_words, due, note):
    e = explain_worker(worker, fleet, T, NOW)
    assert e.state == worker.state
    assert e.next is not None and next_words in e.next
    assert e.due_at == due
    if note is not None:
        assert any(note in n for n in [*e.notes, e.next])


def row(kind: str, state: str, missing: datetime | None = None, **kw) -> RowFacts:
    return RowFacts(kind, "h", kw.pop("worker", "w"), state, missing, **kw)


RUNNING = WorkerFacts("w", "running", ago(60), ago(4))
STALLED = WorkerFacts("w", "stalled", ago(10), ago(40))


@pytest.mark.parametrize(
    ("r", "worker", "fleet", "because", "due", "held"),
    [
        (row("container", "created"), RUNNING, NORMAL, "not missing", None, None),
        (
            row("container", "created", ago(60)),
            RUNNING,
            NORMAL,
            "missing since",
            after(240),
            None,
        ),
        (
            row("volume", "destroying", ago(60)),
            STALLED,
            NORMAL,
            "missing since",
            after(240),
            "worker is stalled",
        ),
        (
            row("volume", "created", ago(60)),
            RUNNING,
            FULL,
            "missing since",
            after(240),
            "fleet in full disruption",
        ),
        (
            row("container", "creating", state_changed_at=ago(600)),
            RUNNING,
            NORMAL,
            "being created",
            after(3000),
            None,
        ),
        (row("task", "running", ago(10)), RUNNING, NORMAL, "missing since", after(290), None),
        (row("task", "pending", worker=None), None, NORMAL, "owed", None, None),
        (row("task", "pending"), RUNNING, NORMAL, "placed on w", None, None),
        (
            row("task", "lost", stop_reason="worker-lost", replaced_by="t-2"),
            None,
            NORMAL,
            "force-reaped (worker-lost)",
            None,
            None,
        ),
    ],
)
def test_a_row_is_explained_by_the_rule_that_holds_it(r, worker, fleet, because, due, held):
    e = explain_row(r, worker, fleet, T, NOW)
    assert because in e.because
    assert e.due_at == due
    if held is None:
        assert not any(n.startswith("destroy held") for n in e.notes)
    else:
        assert any(held in n for n in e.notes)


def test_a_row_that_is_gone_is_explained_by_its_last_event():
    e = explain_gone("container", "c-1", [(ago(9), "destroyed", "missing for 300s")])
    assert e.state == "absent" and e.because.startswith("destroyed at")
    assert explain_gone("volume", "v", []).because == "no row in Postgres"


def test_a_draining_worker_says_where_each_task_of_its_migration_stands():
    from reaper.core.policy.explain_drain import MigrationFacts, explain_drain

    now = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    until = now + timedelta(minutes=30)
    tasks = [
        MigrationFacts("t1", "stopped", "drained", "r1", "x", "running"),
        MigrationFacts("t2", "running", None, "r2", "x", "running"),
        MigrationFacts("t3", "running", None, "r3", "y", "pending"),
        MigrationFacts("t4", "running", None, None, None, None),
        MigrationFacts("t5", "running", None, "r5", "x", "lost"),  # its worker lost: again
    ]
    notes = explain_drain(until, None, tasks, now)
    assert notes[0] == "migrating until 2026-12-07 12:30:00 UTC: what is left then is stopped"
    assert notes[1:] == [
        "t2: replacement r2 runs; it stops next",
        "t3: replacement r3 placed on y, not running",
        "t4: waits for a replacement (max_surge, or no capacity)",
        "t5: waits for a replacement (max_surge, or no capacity)",
    ]
    assert explain_drain(None, now, [], now)[0].startswith("drained since 2026-12-07 12:00:00")
    assert "without --migrate" in explain_drain(None, None, tasks, now)[0]


LOST = WorkerFacts("w", "lost", ago(100), ago(400))
LOST_REAPED = WorkerFacts("w", "lost", ago(100), ago(400), reaped_at=ago(99))


@pytest.mark.parametrize(
    ("r", "worker", "fleet", "next_words", "due"),
    [
        # A task of a stalled worker goes with its reap: when the worker is lost
        # (liveness.next_deadline: last beat 40 s ago + LOST_AFTER 300 s).
        (
            row("task", "running"),
            STALLED,
            NORMAL,
            "reaped (lost) and replaced when w is lost",
            after(260),
        ),
        (
            row("task", "pending"),
            STALLED,
            NORMAL,
            "reaped (lost) and replaced when w is lost",
            after(260),
        ),
        # Its marks do not count while its worker is away; the reap comes first.
        (row("task", "running", ago(10)), STALLED, NORMAL, "when w is lost", after(260)),
        # A lost worker's reap: due now, or held (fleet.may_reap).
        (row("task", "running"), LOST, NORMAL, "its reap is due now", None),
        (row("task", "running"), LOST, FULL, "reap held: fleet in full disruption", None),
        (
            row("task", "running"),
            LOST,
            FleetFacts("partial", 8, 1, recovered_at=ago(60)),
            "fresh LOST_AFTER; reaped at",
            after(240),
        ),
        # Placed after its worker's reap: a stray, taken down by the fleet monitor.
        (row("task", "pending"), LOST_REAPED, NORMAL, "taken down as a stray", None),
    ],
)
def test_a_task_of_an_unhealthy_worker_says_when_it_is_reaped(r, worker, fleet, next_words, due):
    e = explain_row(r, worker, fleet, T, NOW)
    assert e.next is not None and next_words in e.next, e
    assert e.due_at == due
    assert e.because.startswith(f"{r.state} on w, which is {worker.state}: ")
    assert e.due_at == (explain_worker(worker, fleet, T, NOW).due_at if due is not None else None)


def test_a_pending_task_says_it_may_never_start():
    e = explain_row(row("task", "pending", state_changed_at=ago(90)), RUNNING, NORMAL, T, NOW)
    assert e.because.startswith("placed on w at 2026-12-03 11:58:30 UTC (90s ago)")
    assert e.next == "running once its worker reports it (rule 5)"
    [note] = e.notes
    assert "never stops a task its worker has not started" in note
    assert "`task h not started (REASON)`" in note and "never will" in note


def test_a_running_worker_beating_liveness_only_says_since_when():
    complete = {"containers": ago(100), "volumes": ago(100), "tasks": ago(4)}
    w = WorkerFacts("w", "running", ago(600), ago(4), complete_at=complete, row_heartbeat_at=ago(4))
    e = explain_worker(w, NORMAL, T, NOW)
    [note] = [n for n in e.notes if "liveness only" in n]
    assert note.startswith(
        "reports liveness only since 2026-12-03 11:58:20 UTC (containers, volumes): no complete"
        " report for more than RESYNC_INTERVAL (30s)"
    )
    # The row's own heartbeat judges: a fresher beat from the liveness does not.
    fresh = WorkerFacts(
        "w",
        "running",
        ago(600),
        ago(1),
        complete_at={k: ago(20) for k in complete},
        row_heartbeat_at=ago(20),
    )
    assert not [n for n in explain_worker(fresh, NORMAL, T, NOW).notes if "liveness" in n]
    never = WorkerFacts(
        "w", "running", ago(600), ago(4), row_heartbeat_at=ago(4), created_at=ago(600)
    )
    [note] = [n for n in explain_worker(never, NORMAL, T, NOW).notes if "liveness" in n]
    assert note.startswith(
        "reports liveness only: no complete report of containers, volumes, tasks since it"
        " registered at 2026-12-03 11:50:00 UTC"
    )
