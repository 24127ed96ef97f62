"""Which command changes a run may use (``reaper.core.policy.rollout``), and when a healthy
worker's timer is re-armed in a beat's task (``liveness_clock.rearm_due``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reaper.core.config import Settings
from reaper.core.liveness_state import RunFeatures
from reaper.core.models import Timings
from reaper.core.policy import rollout
from reaper.core.policy.liveness_clock import rearm_due

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("peer", "used"), [("1.1", False), ("1.2", True), ("", False), ("1.0", False), ("0.9", False)]
)
def test_a_change_of_this_line_only_once_every_peer_knows_it(
    monkeypatch: pytest.MonkeyPatch, peer: str, used: bool
) -> None:
    monkeypatch.setitem(rollout.COMMAND_CHANGES, "some-change", "1.2")
    assert rollout.uses("some-change", peer) is used


def test_a_run_decides_every_change_its_peers_allow(monkeypatch: pytest.MonkeyPatch) -> None:
    """``RunFeatures`` carries the changes ``in_use`` lists: a change added to the table is
    used by the runs it allows with no other edit (issue 33)."""
    monkeypatch.setitem(rollout.COMMAND_CHANGES, "some-change", "1.2")
    assert "some-change" not in rollout.in_use("1.1")
    assert "some-change" in rollout.in_use("1.2")
    assert RunFeatures(changes=rollout.in_use("1.2")).uses("some-change")
    assert not RunFeatures(changes=rollout.in_use("1.1")).uses("some-change")


def test_every_change_names_a_known_line_and_the_default_is_the_previous_one() -> None:
    assert all(rollout.known_line(v) for v in rollout.COMMAND_CHANGES.values())
    assert rollout.RELEASE_LINES[-2] == rollout.DEFAULT_PEER_VERSION
    with pytest.raises(KeyError):
        rollout.uses("no-such-change", "1.1")


def test_a_start_up_read_without_a_peer_version_counts_as_the_previous_line() -> None:
    recorded = Timings.of(Settings(_env_file=None)).model_dump()  # type: ignore[call-arg]
    del recorded["peer_version"]
    assert Timings.model_validate(recorded).peer_version == rollout.DEFAULT_PEER_VERSION


@pytest.mark.parametrize("peer", ["2.0", "1.0"])
def test_a_peer_version_this_release_cannot_serve_beside_refuses_to_start(peer: str) -> None:
    """1.0 too: this release takes over only from 1.1 (CHANGELOG.md, "Upgrade")."""
    with pytest.raises(ValueError, match=r"REAPER_PEER_VERSION must be one of 1\.1, 1\.2"):
        Settings(_env_file=None, peer_version=peer)  # type: ignore[call-arg]


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
