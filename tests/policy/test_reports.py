"""Table tests of ``policy.reports.liveness_only``: when a worker's beats count as liveness
only (no complete report of a kind for longer than ``RESYNC_INTERVAL`` before its last
heartbeat). Times are seconds after T0; ``RESYNC_INTERVAL`` is 30 s."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reaper.core.policy.reports import LivenessOnly, liveness_only

T0 = datetime(2026, 12, 7, 14, 0, tzinfo=UTC)
RESYNC = 30.0
ALL = ("containers", "volumes", "tasks")


def at(seconds: float | None) -> datetime | None:
    return None if seconds is None else T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "state, beat, complete, expected",
    [
        # Every beat complete: nothing to say.
        ("running", 100, (100, 100, 100), None),
        # Within RESYNC_INTERVAL of the last beat: still fine (the row is one snapshot).
        ("running", 100, (70, 70, 70), None),
        # Past it: liveness only since the last complete report.
        ("running", 100, (69, 69, 69), LivenessOnly(ALL, at(69))),
        # One kind behind (an engine that lists containers but not volumes).
        ("running", 100, (100, 10, 100), LivenessOnly(("volumes",), at(10))),
        # Several behind: since the oldest of them.
        ("running", 100, (50, 10, 100), LivenessOnly(("containers", "volumes"), at(10))),
        # Never a complete report of a kind: since is unknown.
        ("running", 100, (100, None, 100), LivenessOnly(("volumes",), None)),
        ("running", 100, (None, None, None), LivenessOnly(ALL, None)),
        # A worker that does not beat is silent, not liveness only: not judged.
        ("stalled", 100, (0, 0, 0), None),
        ("lost", 100, (0, 0, 0), None),
        ("retired", 100, (None, None, None), None),
        ("running", None, (None, None, None), None),  # never beat
    ],
)
def test_liveness_only(state, beat, complete, expected):
    complete_at = {k: at(t) for k, t in zip(ALL, complete, strict=True)}
    assert liveness_only(state, at(beat), complete_at, RESYNC) == expected


def test_a_kind_left_out_counts_as_never():
    assert liveness_only("running", at(5), {"containers": at(5)}, RESYNC) == LivenessOnly(
        ("volumes", "tasks"), None
    )
