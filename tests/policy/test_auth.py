"""Table tests of ``reaper.core.policy.auth`` (CONTRACT.md §5.2)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reaper.core.policy.auth import (
    AuthMode,
    BeatAuth,
    Signer,
    judge_beat,
    judge_operator_signal,
    prune_used,
)

K, OTHER = "key-A", "key-B"
off, pin, required = AuthMode.off, AuthMode.pin, AuthMode.required


@pytest.mark.parametrize(
    "mode, pinned, carries, key, valid, accepted, pins",
    [
        # off: v1, anything goes, nothing pinned
        (off, K, True, None, False, True, None),
        (off, None, False, None, False, True, None),
        # pin: unsigned workers stay v1; a valid signed beat pins
        (pin, None, False, None, False, True, None),
        (pin, None, True, K, True, True, K),
        (pin, K, True, K, True, True, None),
        # signed but bad, even before a pin exists
        (pin, None, True, K, False, False, None),
        (pin, None, True, None, False, False, None),  # sig without key, or null key
        # pinned: only that key
        (pin, K, False, None, False, False, None),
        (pin, K, True, OTHER, True, False, None),
        # required: nobody registers unsigned
        (required, None, False, None, False, False, None),
        (required, None, True, K, True, True, K),
        (required, K, True, OTHER, True, False, None),
    ],
)
def test_judge_beat(mode, pinned, carries, key, valid, accepted, pins):
    verdict = judge_beat(mode, pinned, carries, key, valid)
    assert isinstance(verdict, BeatAuth)
    assert (verdict.accepted, verdict.pin) == (accepted, pins)
    assert (verdict.reason is None) == accepted


NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
OK = dict(worker="w1", signed_at=NOW, signer=Signer.operator, replayed=False, named=None)


@pytest.mark.parametrize(
    "mode, signal, changes, rejected",
    [
        (pin, "force_reap", dict(signer=None, worker=None, signed_at=None), False),
        (off, "force_reap", dict(signer=None), False),
        (required, "force_reap", {}, False),
        (required, "force_reap", dict(signer=None), True),
        (required, "force_reap", dict(worker="w2"), True),
        (required, "force_reap", dict(signed_at=NOW - timedelta(seconds=301)), True),
        (required, "force_reap", dict(signed_at=NOW + timedelta(seconds=301)), True),
        (required, "force_reap", dict(signed_at=NOW - timedelta(seconds=299)), False),
        (required, "force_reap", dict(signed_at=None), True),
        (required, "force_reap", dict(replayed=True), True),
        (required, "force_reap", dict(named="undrain"), True),
        (required, "force_reap", dict(named="force_reap"), False),
        # a worker's own key: retire and drain only
        (required, "retire", dict(signer=Signer.worker), False),
        (required, "drain", dict(signer=Signer.worker), False),
        (required, "undrain", dict(signer=Signer.worker), True),
        (required, "force_reap", dict(signer=Signer.worker), True),
    ],
)
def test_judge_operator_signal(mode, signal, changes, rejected):
    args = {**OK, **changes}
    reason = judge_operator_signal(
        mode,
        signal,
        "w1",
        args["worker"],
        args["signed_at"],
        NOW,
        args["signer"],
        args["replayed"],
        args["named"],
    )
    assert (reason is not None) == rejected, reason


def test_prune_used_keeps_only_what_could_still_arrive():
    used = {"old": NOW - timedelta(seconds=301), "young": NOW - timedelta(seconds=10)}
    assert prune_used(used, NOW) == {"young": used["young"]}
