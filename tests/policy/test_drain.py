"""Drain and undrain requests (``reaper.core.policy.drain``): which are kept until applied,
and which change ``workers.draining``."""

from __future__ import annotations

import pytest

from reaper.core.liveness_state import DrainRequest
from reaper.core.policy.drain import drain_changes, queue_drain


def req(draining: bool, reason: str = "") -> DrainRequest:
    return DrainRequest(draining=draining, reason=reason, key=reason)


def flags(requests: list[DrainRequest]) -> list[bool]:
    return [r.draining for r in requests]


def test_requests_are_kept_in_order_of_arrival():
    queued, dropped = queue_drain([], req(True, "upgrade"))
    queued, dropped = queue_drain(queued, req(False, "done"))
    assert [r.reason for r in queued] == ["upgrade", "done"] and dropped == 0


def test_a_request_that_repeats_the_last_queued_is_dropped_and_the_first_kept():
    queued, dropped = queue_drain([req(True, "first")], req(True, "second"))
    assert [r.reason for r in queued] == ["first"] and dropped == 1


def test_a_full_queue_drops_the_newest_request_with_the_one_it_undoes():
    full = [req(i % 2 == 0, str(i)) for i in range(4)]  # drain, undrain, drain, undrain
    queued, dropped = queue_drain(full, req(True, "4"), limit=4)
    assert [r.reason for r in queued] == ["0", "1", "2"] and dropped == 2
    assert flags(queued)[-1] is True  # ends where applying all five would end


@pytest.mark.parametrize("n", range(1, 40))
def test_any_alternating_flood_keeps_the_outcome_and_stays_bounded(n):
    queued: list[DrainRequest] = []
    for i in range(n):
        queued, _ = queue_drain(queued, req(i % 2 == 0, str(i)), limit=4)
    assert len(queued) <= 4
    assert flags(queued)[-1] is ((n - 1) % 2 == 0)
    assert all(a != b for a, b in zip(flags(queued), flags(queued)[1:], strict=False))


def test_the_queued_value_is_not_changed():
    queued = [req(True, "a")]
    queue_drain(queued, req(False, "b"))
    assert [r.reason for r in queued] == ["a"]


def test_a_limit_below_two_is_refused():
    with pytest.raises(ValueError, match="at least 2"):
        queue_drain([], req(True), limit=1)


@pytest.mark.parametrize(
    ("start", "requests", "changing"),
    [
        (False, [True], ["0"]),
        (True, [True], []),
        (False, [True, False], ["0", "1"]),  # a drain and an undrain together: both rows
        (False, [False, True], ["1"]),  # an undrain of an undrained worker changes nothing
        (True, [False, True, False], ["0", "1", "2"]),
        (False, [], []),
    ],
)
def test_the_requests_that_change_the_row(start, requests, changing):
    batch = [req(d, str(i)) for i, d in enumerate(requests)]
    assert [r.reason for r in drain_changes(start, batch)] == changing
