"""The contract's payloads (CONTRACT.md §2): malformed heartbeats are rejected, digests."""

from __future__ import annotations

import hashlib
import json

import pytest

from reaper.core.contract import MAX_SEQ, Heartbeat, ReasonInput
from reaper.core.protocol import report_digest


def test_report_digest_ignores_order_and_repeats():
    assert report_digest(["a", "b"]) == report_digest(["b", "a", "a"])
    assert report_digest(["a"]) != report_digest(["a", "b"])
    assert report_digest([]) != report_digest([""])
    # no ambiguity from concatenation
    assert report_digest(["ab", "c"]) != report_digest(["a", "bc"])


def test_report_digest_is_sha256_of_sorted_handles_each_followed_by_nul():
    """The definition in docs/large-reports.md, which agents in other languages implement:
    sha256 over the sorted distinct handles (code point order), each followed by a NUL byte."""
    handles = ["zeta", "\u00e9t\u00e9", "alpha", "\U0001f600", "alpha", "Zulu"]
    h = hashlib.sha256()
    for handle in sorted(set(handles)):
        h.update(handle.encode() + b"\0")
    assert report_digest(handles) == h.hexdigest()
    assert report_digest([]) == hashlib.sha256(b"").hexdigest()


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
        {"seq": MAX_SEQ + 1},  # beyond Postgres bigint: every write of the row would fail
        {"seq": 2**64},
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


@pytest.mark.parametrize(
    ("handle", "ok"),
    [
        ("x", True),
        ("x" * 512, True),
        ("\U0001f600" * 512, True),  # characters, not bytes
        ("caf\u00e9 \u00a0\u2028", True),  # only C0, DEL and C1 are control characters here
        ("", False),
        ("x" * 513, False),
        ("\U0001f600" * 513, False),
        ("a\x00", False),
        ("\x1fa", False),
        ("a\x7fb", False),
        ("a\x80", False),
        ("a\x9f", False),
        ("a\n", False),
    ],
)
def test_handles_are_1_to_512_characters_without_control_characters(handle, ok):
    """CONTRACT.md §2, in a chunk's handles and in an inline list, from JSON as a signal is."""
    chunk = {"kind": "containers", "report_id": "r", "index": 0, "count": 1, "digest": "0" * 64}
    for beat in (
        {**GOOD, "containers": [handle]},
        {**GOOD, "chunk": {**chunk, "handles": [handle]}},
    ):
        raw = json.dumps(beat)
        if ok:
            Heartbeat.model_validate_json(raw)
        else:
            with pytest.raises(ValueError):
                Heartbeat.model_validate_json(raw)


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


def test_the_largest_seq_is_postgres_bigint():
    assert Heartbeat.model_validate({**GOOD, "seq": MAX_SEQ}).seq == 2**63 - 1


@pytest.mark.parametrize(
    "raw",
    [
        {"reason": "a\u0000b"},
        {"reason": "ok", "actor": "\u0000"},
        {"reason": "ok", "boot_id": "b\u0000"},
        {"reason": "x" * 1001},
    ],
)
def test_operator_signals_postgres_cannot_store_are_rejected(raw):
    """A reason with NUL would fail every write of its events row, for ever (breaker
    finding, 2026-12-02): malformed input, rejected."""
    with pytest.raises(ValueError):
        ReasonInput.model_validate(raw)


def test_operator_signal_text_may_hold_other_characters():
    req = ReasonInput.model_validate({"reason": "disk\tfailed\n(é, 漢字)", "actor": "ops"})
    assert req.reason == "disk\tfailed\n(é, 漢字)"
