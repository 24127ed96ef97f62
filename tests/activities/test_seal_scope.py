"""``supersede_queued``: a report taking an older one's place in the collector's queue keeps
what the liveness sealed and carries what the older saw outside the seal (rule 4)."""

from __future__ import annotations

from datetime import UTC, datetime

from activities.collection import beyond_seal
from activities.types import SealedReport
from reaper.core.models import Report, supersede_queued
from reaper.core.protocol import report_digest

AT = datetime(2026, 12, 5, 8, 44, tzinfo=UTC)


def report(handles: list[str], **fields) -> Report:
    return Report(
        kind="tasks",
        handles=handles,
        taken_at=AT,
        boot_id="b-1",
        digest=report_digest(handles),
        seal="sealed-by-the-liveness",
        **fields,
    )


def sealed_fields(r: Report) -> SealedReport:
    return SealedReport.of(r)


def test_the_sealed_fields_stay_and_the_older_handles_go_outside_the_seal():
    older = report(["t-1", "t-2"], also_seen=["t-0"])
    newer = report(["t-1"], also_seen=["t-9"])
    got = supersede_queued(older, newer)
    assert sealed_fields(got) == sealed_fields(newer)
    assert got.queued_also_seen == ["t-0", "t-2"] and not got.queued_restart_all


def test_a_chain_of_queued_reports_carries_every_older_handle():
    a, b, c = report(["t-1", "t-3"]), report(["t-1", "t-2"]), report(["t-1"])
    got = supersede_queued(supersede_queued(a, b), c)
    assert got.queued_also_seen == ["t-2", "t-3"]
    assert sealed_fields(got) == sealed_fields(c)


def test_a_staged_report_restarts_every_mark_outside_the_seal():
    older = report([], staged_id="r-1")
    got = supersede_queued(older, report(["t-1"]))
    assert got.queued_restart_all and not got.restart_all and got.queued_also_seen == []


def test_queued_fields_a_sender_put_in_a_report_are_dropped():
    newer = report(["t-1"], queued_also_seen=["x"], queued_restart_all=True)
    for older in (None, report(["t-1"])):
        got = supersede_queued(older, newer)
        assert got.queued_also_seen == [] and not got.queued_restart_all


def test_a_reconcile_may_restart_more_clocks_than_sealed_never_fewer():
    r = sealed_fields(report(["t-1"], also_seen=["t-0"], restart_all=False))
    assert beyond_seal(r, None, False, ["t-0"]) is None
    assert beyond_seal(r, None, True, ["t-0", "t-2"]) is None  # the queue's extras
    assert beyond_seal(r, None, False, []) is not None  # a sealed restart dropped
    assert beyond_seal(r, "r-9", False, ["t-0"]) is not None  # another staged report
    staged = sealed_fields(report([], staged_id="r-1", restart_all=True))
    assert beyond_seal(staged, "r-1", False, []) is not None  # restart_all dropped
    assert beyond_seal(None, None, False, []) is None  # no report: seal_refusal's to refuse
