"""Reaper's data converter (``reaper.infra.temporal.DATA_CONVERTER``) writes and reads exactly
what ``temporalio.contrib.pydantic``'s does, so agents and clients with either agree, and is
built once however often the SDK asks for a payload converter."""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio.contrib.pydantic import pydantic_data_converter

from reaper.core.contract import Heartbeat
from reaper.infra.temporal import DATA_CONVERTER, SharedPayloadConverter

VALUES = [
    Heartbeat(worker="w", boot_id="b", seq=3, containers=["c1", "c2"]),
    {"worker": "w", "at": datetime(2026, 12, 7, 21, 0, tzinfo=UTC), "kinds": {"volumes"}},
    None,
    b"\x00raw",
]


def test_it_writes_the_payloads_the_pydantic_converter_writes():
    ours = DATA_CONVERTER.payload_converter.to_payloads(VALUES)
    theirs = pydantic_data_converter.payload_converter.to_payloads(VALUES)
    assert ours == theirs


def test_it_reads_what_the_pydantic_converter_wrote_into_the_types_asked():
    payloads = pydantic_data_converter.payload_converter.to_payloads(VALUES[:1])
    (beat,) = DATA_CONVERTER.payload_converter.from_payloads(payloads, [Heartbeat])
    assert beat == VALUES[0]
    (at,) = DATA_CONVERTER.payload_converter.from_payloads(
        pydantic_data_converter.payload_converter.to_payloads([VALUES[1]["at"]]), [datetime]
    )
    assert at == VALUES[1]["at"]


def test_a_new_payload_converter_shares_the_converters_built_once():
    a, b = SharedPayloadConverter(), SharedPayloadConverter()
    assert a is not b
    assert list(a.converters.values()) == list(b.converters.values())
    assert all(x is y for x, y in zip(a.converters.values(), b.converters.values(), strict=True))
