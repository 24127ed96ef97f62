"""The contract's payloads (CONTRACT.md §2): malformed heartbeats are rejected, digests."""

from __future__ import annotations

import pytest

from reaper.core.contract import Heartbeat
from reaper.core.protocol import report_digest


def test_report_digest_ignores_order_and_repeats():
    assert report_digest(["a", "b"]) == report_digest(["b", "a", "a"])
    assert report_digest(["a"]) != report_digest(["a", "b"])
    assert report_digest([]) != report_digest([""])
    # no ambiguity from concatenation
    assert report_digest(["ab", "c"]) != report_digest(["a", "bc"])


GOOD = {"worker": "w1", "boot_id": "b", "seq": 0}


@pytest.mark.parametrize(
    "patch",
    [
        {"worker": ""},
        {"worker": "w 1"},
        {"worker": "w/1"},
        {"worker": "x" * 254},
        {"seq": -1},
        {"seq": "x"},
        {"seq": "7"},
        {"seq": 1.5},
        {"seq": True},
        {"boot_id": ""},
        {"containers": ["ok", ""]},
        {"containers": ["a\nb"]},
        {"volumes": ["x" * 513]},
        {"tasks": "t-1"},
        {"containers": [1]},
    ],
)
def test_malformed_heartbeats_are_rejected(patch):
    with pytest.raises(ValueError):
        Heartbeat.model_validate({**GOOD, **patch})


def test_valid_heartbeat_shapes():
    hb = Heartbeat.model_validate(
        {
            **GOOD,
            "worker": "node-1.eu:a_b".replace("_", "-"),
            "containers": [],
            "volumes": None,
            "future": 1,
        }
    )
    assert hb.containers == [] and hb.volumes is None and hb.is_complete_report
    assert not Heartbeat.model_validate(GOOD).is_complete_report
    assert Heartbeat.model_validate({**GOOD, "worker": "x" * 253}).worker
