"""Table tests of the placement policy: where replacements go, how many (CONTRACT.md rule 5)."""

from __future__ import annotations

import pytest

from reaper.core.policy.placement import deficit, place, place_owed
from tests.support.rule_models import placeable


@pytest.mark.parametrize(
    "candidates, count, expected",
    [
        ({}, 2, []),
        ({"w1": 0}, 3, ["w1", "w1", "w1"]),
        ({"w1": 2, "w2": 0, "w3": 1}, 3, ["w2", "w2", "w3"]),
        ({"b": 1, "a": 1}, 1, ["a"]),  # ties: deterministic by name
    ],
)
def test_place_on_fewest_running(candidates, count, expected):
    assert place(candidates, count) == expected


@pytest.mark.parametrize(
    "desired, active, gone, expected",
    [(3, 2, 0, 1), (3, 3, 0, 0), (3, 5, 0, 0), (3, 3, 1, 1), (0, 0, 0, 0)],
)
def test_a_service_is_never_above_desired_count(desired, active, gone, expected):
    assert deficit(desired, active, gone) == expected


@pytest.mark.parametrize(
    "state, draining, ok",
    [
        ("running", False, True),
        ("running", True, False),
        ("stalled", False, False),
        ("lost", False, False),
        ("retired", False, False),
    ],
)
def test_only_running_non_draining_workers_get_work(state, draining, ok):
    assert placeable(state, draining) is ok


@pytest.mark.parametrize(
    "owed, candidates, expected",
    [
        ([("a1", "api")], {}, []),  # nowhere yet: still owed
        ([("a1", "api")], {"w3": 0}, [("a1", "w3")]),  # a worker joins
        (
            [("a1", "api"), ("b1", "db")],
            {"w1": 1, "w2": 0},
            [("a1", "w2"), ("b1", "w1")],
        ),  # oldest first, least loaded
        ([("a1", "api"), ("a2", "api")], {"w1": 5}, [("a1", "w1"), ("a2", "w1")]),
    ],
)
def test_owed_work_is_placed_oldest_first_on_the_least_loaded(owed, candidates, expected):
    assert place_owed(owed, candidates) == expected
