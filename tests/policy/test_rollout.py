"""Which command changes a run may use (``reaper.core.policy.rollout``), and when a healthy
worker's timer is re-armed in a beat's task (``liveness_clock.rearm_due``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reaper.core.config import Settings
from reaper.core.models import Timings
from reaper.core.policy import rollout
from reaper.core.policy.liveness_clock import rearm_due

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "change",
    [
        rollout.REARM_ON_BEAT,
        rollout.WIDE_STAGING,
        rollout.DROP_SUPERSEDED_CHUNKS,
        rollout.DRAIN_IN_ORDER,
    ],
)
@pytest.mark.parametrize(
    ("peer", "used"), [("1.0", False), ("1.1", True), ("", False), ("0.9", False)]
)
def test_a_change_of_1_1_only_once_every_peer_knows_it(change: str, peer: str, used: bool) -> None:
    assert rollout.uses(change, peer) is used


def test_every_change_names_a_known_line_and_the_default_is_the_previous_one() -> None:
    assert all(rollout.known_line(v) for v in rollout.COMMAND_CHANGES.values())
    assert rollout.RELEASE_LINES[-2] == rollout.DEFAULT_PEER_VERSION
    with pytest.raises(KeyError):
        rollout.uses("no-such-change", "1.1")


def test_a_history_without_a_peer_version_ran_as_the_previous_line() -> None:
    recorded = Timings.of(Settings(_env_file=None)).model_dump()  # type: ignore[call-arg]
    del recorded["peer_version"]
    assert Timings.model_validate(recorded).peer_version == "1.0"


def test_an_unknown_peer_version_refuses_to_start() -> None:
    with pytest.raises(ValueError, match=r"REAPER_PEER_VERSION must be one of 1\.0, 1\.1"):
        Settings(_env_file=None, peer_version="2.0")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("armed_in", "moved_to", "due"),
    [
        (20, 30, False),  # fires in two intervals: the next beat re-arms it
        (15, 30, True),  # fires within 1.5 intervals: before the next beat, give or take
        (10, 30, True),
        (10, 10, False),  # the deadline did not move
        (15, 12, False),  # an earlier deadline: the loop re-arms that in any case
        (1.5, 30, True),
        (1, 30, False),  # due within a tenth of an interval: left to fire, not cancelled
        (0, 30, False),
    ],
)
def test_rearm_due(armed_in: float, moved_to: int, due: bool) -> None:
    armed_for = T0 + timedelta(seconds=armed_in)
    assert rearm_due(armed_for, T0 + timedelta(seconds=moved_to), T0, 10.0) is due
