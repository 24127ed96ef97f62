"""The Web UI's view of a liveness and its collector: current details kept live, read as the
Web UI reads them (the SDK's ``__temporal_workflow_metadata`` query), under time skipping.

Timings: heartbeat 10 s, stalled after 30 s, lost after 300 s, missing TTL 300 s.
"""

from __future__ import annotations

from tests.support.heartbeats import current_details
from tests.support.polling import eventually
from tests.support.scheduler import insert
from workflows.common import collector_id, liveness_id
from workflows.view import utc


def facts(details: str) -> dict[str, str]:
    """``- **label**: value`` lines of the details, label -> value."""
    return {
        label: value
        for line in details.splitlines()
        if line.startswith("- **") and "**: " in line
        for label, value in [line[4:].split("**: ", 1)]
    }


async def test_liveness_details_show_state_heartbeat_missing_and_draining(fleet):
    w, x = fleet.name("w"), fleet.name("x")
    await insert(fleet.pool, "volumes", w, ["v-1", "v-2"])
    await fleet.beat(x)
    st = await fleet.beat(w, volumes=["v-1"])  # v-2 is missing
    shown = await eventually(
        lambda: current_details(fleet.client, liveness_id(w)),
        lambda d: facts(d).get("missing") == "1 (volumes 1)",
        what="missing volume shown",
    )
    seen = facts(shown)
    assert seen["worker"] == w
    assert seen["state"] == f"running since {utc(st.state_since)}"
    assert seen["last heartbeat"] == f"{utc(st.last_heartbeat_at)} (seq {st.last_seq})"
    assert seen["orphans"] == "0" and seen["draining"] == "no"
    assert seen["boot id"] == st.boot_id
    gc = await current_details(fleet.client, collector_id(w))
    assert "- **volumes**: 1 missing, the first due at" in gc, gc

    # Every beat moves the last heartbeat shown (no history event is written for it).
    await fleet.advance(10)
    later = await fleet.beat(w, volumes=["v-1", "v-2"])  # v-2 is back
    assert later.last_heartbeat_at != st.last_heartbeat_at
    shown = await eventually(
        lambda: current_details(fleet.client, liveness_id(w)),
        lambda d: facts(d)["missing"] == "0",
        what="v-2 no longer missing",
    )
    assert facts(shown)["last heartbeat"] == f"{utc(later.last_heartbeat_at)} (seq 1)"
    # A beat that changes nothing else wakes no step of the loop: the handler shows it.
    await fleet.advance(2)
    later = await fleet.beat(w, volumes=["v-1", "v-2"])
    shown = await current_details(fleet.client, liveness_id(w))
    assert facts(shown)["last heartbeat"] == f"{utc(later.last_heartbeat_at)} (seq 2)"

    await fleet.client.get_workflow_handle(liveness_id(w)).signal(
        "drain", {"reason": "kernel upgrade"}
    )
    await eventually(
        lambda: current_details(fleet.client, liveness_id(w)),
        lambda d: facts(d)["draining"] == "yes: kernel upgrade",
        what="draining shown",
    )

    # Silent for STALL_AFTER while x beats on: stalled, judged on the controller's clock.
    await fleet.advance(40, beating={x: {}})
    stalled = await fleet.state(w)
    assert stalled.state == "stalled"
    shown = await eventually(
        lambda: current_details(fleet.client, liveness_id(w)),
        lambda d: facts(d)["state"].startswith("stalled"),
        what="stalled shown",
    )
    assert facts(shown)["state"] == f"stalled since {utc(stalled.state_since)}"
    assert facts(shown)["last heartbeat"] == f"{utc(later.last_heartbeat_at)} (seq 2)"
