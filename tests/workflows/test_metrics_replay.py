"""``reaper_heartbeats_rejected_total`` (CONTRACT.md §5.4) is bumped by the liveness
workflow's signal handler: once when the rejection happens, never again when the history is
replayed (a controller restart, a cache eviction)."""

from __future__ import annotations

from prometheus_client import REGISTRY

from tests.support.upgrade import replay_failures
from workflows.common import liveness_id


def rejected() -> float:
    return REGISTRY.get_sample_value("reaper_heartbeats_rejected_total") or 0.0


async def test_a_rejection_counts_once_live_and_never_on_replay(fleet):
    a = fleet.name("a")
    await fleet.beat(a)
    before = rejected()
    intruder = {"worker": "intruder", "boot_id": "b", "seq": 1, "sent_at": "2026-11-30T10:00:00Z"}
    await fleet.raw(a, intruder)  # sent to another worker's liveness
    st = await fleet.raw(a, {"worker": a, "seq": "not a number"})  # malformed
    assert st.rejected == 2
    assert rejected() == before + 2

    history = await fleet.client.get_workflow_handle(liveness_id(a)).fetch_history()
    assert await replay_failures([history]) == {}
    assert rejected() == before + 2
