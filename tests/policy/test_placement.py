"""Table tests of the placement policy: where replacements go, how many (CONTRACT.md rule 5)."""

from __future__ import annotations

import pytest

from reaper.core.policy.placement import deficit, place


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
