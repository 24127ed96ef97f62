"""The checker's host-rotation invariants (CONTRACT.md §6.1) applied to ``events`` rows as
``activities/migration.py`` writes them: an original stopped ``drained`` only once its
replacement ran (its worker's agent reported it), a task stopped ``drain-deadline`` only
once a rotation's deadline had come, a replacement stopped ``undrained`` only after an
undrain; and a service never above ``desired_count + max_surge``. Times are seconds; the
clock slack is the campaign's 0.5 s."""

from __future__ import annotations

import pytest

from chaos.checker import Checker
from chaos.ledger import Beat, Command, Ledger
from chaos.observe import Event, Observations
from reaper.core.policy import migration

DRAINED = f"{migration.DRAINED}: its replacement r1 runs"
DEADLINE = f"{migration.DEADLINE}: still on w1 at its drain's deadline"
UNDRAINED = f"{migration.UNDRAINED}: the drain of w1 ended before it ran"


def checker(beats: list[tuple[float, tuple[str, ...]]], commands: list[Command]) -> Checker:
    """w1 rotated (``commands``); its original t1's replacement r1 placed on w2, whose agent
    sent ``beats`` (send time, tasks held), each acknowledged 0.1 s later."""
    ledger = Ledger()
    for sent, tasks in beats:
        ledger.beat(
            Beat("w2", "boot-2", int(sent * 10), sent, sent + 0.1, {"tasks": frozenset(tasks)})
        )
    for c in commands:
        ledger.command("w1", c)
    obs = Observations()
    obs.tasks = {"t1": ("svc", "w1", "stopped"), "r1": ("svc", "w2", "running")}
    return Checker(ledger, obs, lambda _: None)


ROTATE = Command("rotate", 100.0, 5.0)
EARLY = "§6.1: original stopped before its replacement ran"
NOT_COME = "§6.1: stopped at a drain deadline that had not come"
NO_UNDRAIN = "§6.1: replacement stopped as undrained without an undrain"
HELD = [(101.0, ()), (102.0, ("r1",)), (103.0, ("r1",))]


@pytest.mark.parametrize(
    "reason, at, handle, commands, beats, broken",
    [
        (DRAINED, 104.0, "t1", [ROTATE], HELD, None),  # r1 reported at 102 s
        (DRAINED, 101.4, "t1", [ROTATE], HELD, EARLY),
        (DRAINED, 104.0, "t1", [ROTATE], HELD[:1], EARLY),
        (DEADLINE, 105.2, "t1", [ROTATE], HELD[:1], None),  # deadline 105 s (+ slack)
        (DEADLINE, 104.0, "t1", [ROTATE], HELD, NOT_COME),
        (DEADLINE, 200.0, "t1", [], HELD, NOT_COME),
        (UNDRAINED, 104.0, "r1", [ROTATE, Command("undrain", 103.0)], HELD, None),
        (UNDRAINED, 104.0, "r1", [ROTATE, Command("undrain", 106.0)], HELD, NO_UNDRAIN),
        (UNDRAINED, 104.0, "r1", [ROTATE], HELD, NO_UNDRAIN),
    ],
)
def test_migration_stops(reason, at, handle, commands, beats, broken):
    c = checker(beats, commands)
    worker = None if reason == UNDRAINED else "w1"
    c.event(Event(1, at, worker, "task", handle, "stopped", reason, "reaper"))
    assert [v.rule for v in c.violations.values()] == ([broken] if broken else [])


@pytest.mark.parametrize(
    "services, broken",
    [
        ({"svc": (3, 1, 4, 1)}, []),  # one replacement beside its original
        ({"svc": (3, 2, 5, 2)}, []),
        ({"svc": (3, 1, 5, 2)}, ["§6.1: service above desired_count + max_surge"]),
        ({"svc": (3, 1, 4, 0)}, ["§5.1: service above desired_count"]),  # no migration
    ],
)
def test_service_counts(services, broken):
    c = checker(HELD, [ROTATE])
    c.obs.services, c.obs.services_at = services, 100.0
    c.services(100.0)
    assert [v.rule for v in c.violations.values()] == broken
