"""Replay stored histories against today's workflow code (entity workflows live
for ever, so a code change that alters the command sequence of a running history must be
gated with ``workflow.patched``). A failing replay here means exactly that.

Regenerate the stored histories of the current code (only when a change is meant to be
incompatible and no deployment runs the old code):
``REAPER_RECORD_HISTORIES=1 pytest tests/workflows/test_replay.py``.

The histories of each release, ``release-<version>-*.json``, are never regenerated: they are
what that release's controller wrote, recorded once when the release is the previous one,
by the upgrade test (``REAPER_RECORD_HISTORIES=1 pytest -m upgrade -k sequential
tests/e2e/test_upgrade.py``). A release's histories leave only with a patch that the
rule of docs/architecture.md ("Replay and patches") retires.
"""

from __future__ import annotations

import os

import pytest

from reaper.core import protocol
from reaper.core.protocol import build_beats
from tests.support.fleet import fleet_with
from tests.support.heartbeats import send
from tests.support.releases import HISTORIES, replay_stored
from tests.support.scheduler import insert, setup_service
from workflows.common import fleet_monitor_id

RECORD = os.environ.get("REAPER_RECORD_HISTORIES") == "1"


async def _record(fleet) -> None:
    """A life in short: beats, a mark, a destroy, a stall, a return, a reap; and the fleet
    monitor that watched it."""
    a, b = fleet.name("a"), fleet.name("b")
    await insert(fleet.pool, "volumes", a, ["v-1", "v-2"])
    await setup_service(fleet.pool, "web", {a: ["t-a"], b: []})
    await fleet.beat(a, volumes=["v-1", "v-2"], tasks=[])
    await fleet.beat(a, volumes=["v-1"], tasks=["t-a"])
    await fleet.beat(b, tasks=[])
    await fleet.advance(320, beating={a: {"volumes": ["v-1"], "tasks": ["t-a"]}, b: {"tasks": []}})
    await fleet.advance(60, beating={b: {"tasks": []}})  # a stalls
    await fleet.beat(a, volumes=["v-1"], tasks=["t-a"])  # and returns
    await fleet.advance(320, beating={b: {"tasks": []}})  # a is lost and reaped
    HISTORIES.mkdir(exist_ok=True)
    for wid, name in (
        (f"liveness-{a}", "liveness"),
        (f"gc-{a}", "collector"),
        (f"reap-{a}-1", "reap"),
        (fleet_monitor_id(fleet.tq), "fleet"),
    ):
        history = await fleet.client.get_workflow_handle(wid).fetch_history()
        (HISTORIES / f"{name}.json").write_text(history.to_json())


async def _record_chunks(fleet, monkeypatch) -> None:
    """A life of large reports: steady beats whose tasks re-arm the deadline timer
    (``rearm-on-beat``), a report in six small chunks sent at once (``wide-staging``: staged
    together), two more queued behind a held chunk, the older dropped unstaged
    (``drop-superseded-chunks``), a stall and a return."""
    w = fleet.name("p")
    await insert(fleet.pool, "containers", w, [f"c-{i:03d}" for i in range(120)])
    await fleet.beat(w, containers=[f"c-{i:03d}" for i in range(120)])
    await fleet.advance(60, beating={w: {}})
    # Six chunks of a 119-handle list (the agent's limits made small).
    monkeypatch.setattr(protocol, "INLINE_MAX_BYTES", 256)
    monkeypatch.setattr(protocol, "CHUNK_MAX_BYTES", 160)
    beats = build_beats(w, fleet.boot[w], fleet.seq[w] + 1, {"containers": HANDLES_1_1}, None)
    assert len(beats) > 5
    for b in beats:
        await send(fleet.client, fleet.tq, b, worker=w)
    fleet.seq[w] = beats[-1]["seq"]
    await fleet.settle(w, lambda s: s.last_seq == fleet.seq[w])
    # Two more reports queue behind a chunk held in Postgres (the lock each stage_chunk
    # takes after its insert): the older one's chunks are dropped unstaged.
    older = build_beats(w, fleet.boot[w], fleet.seq[w] + 1, {"containers": HANDLES_1_1[3:]}, None)
    newer = build_beats(w, fleet.boot[w], older[-1]["seq"] + 1, {"containers": HANDLES_1_1}, None)
    async with fleet.staging_held(w):
        for b in older + newer:
            await fleet.took(w, b)
    fleet.seq[w] = newer[-1]["seq"]
    await fleet.settle(w, lambda s: s.last_seq == fleet.seq[w])
    await fleet.advance(60, beating={})  # stalls
    await fleet.beat(w)  # and returns
    await fleet.advance(30, beating={w: {}})
    history = await fleet.client.get_workflow_handle(f"liveness-{w}").fetch_history()
    (HISTORIES / "liveness-chunks.json").write_text(history.to_json())


HANDLES_1_1 = [f"c-{i:03d}" for i in range(1, 120)]


@pytest.mark.skipif(not RECORD, reason="set REAPER_RECORD_HISTORIES=1 to record")
async def test_record_histories(time_env, pool):
    async with fleet_with(time_env, pool, monitor=True) as fleet:
        await _record(fleet)


@pytest.mark.skipif(not RECORD, reason="set REAPER_RECORD_HISTORIES=1 to record")
async def test_record_chunks_history(fleet, monkeypatch):
    await _record_chunks(fleet, monkeypatch)


# liveness, collector, reap, fleet: the life above, recorded by the code of the 1.2 line
# (REAPER_RECORD_HISTORIES=1); liveness-chunks: the large reports' life, likewise.
# collector-kinds-apart: a collector after the ``kinds-apart`` patch (1.0 line).
# liveness-peer-1.1: a life recorded at REAPER_PEER_VERSION=1.1 (one-task-start,
# rearm-on-beat, wide-staging and drop-superseded-chunks), commit after 362d144.
# liveness-one-grace: a dead worker's silence across two controller outages: the first late
# look grants the outage grace, the second declares it lost (``one-grace``); recorded by
# tests/e2e/test_outage.py (test_late_looks_in_one_silence_share_one_grace,
# REAPER_RECORD_HISTORIES=1) on the 1.2 line.
# liveness-in-task-loss, reap-in-task-loss: a dead worker lost and reaped with
# ``in-task-loss`` (the loss and the reap local activities), recorded by the 1.1 line.
# release-<version>-*: what the previous release's controller wrote in the upgrade test
# (tests/e2e/test_upgrade.py records them with REAPER_RECORD_HISTORIES=1, from the release
# exported from git, at its own peer version): every one replays on the current code.
# 1.2 retired the histories of the 1.0 line (release-1.0.0-*, and those recorded before
# ``lean-start``, ``refresh-at-bound``, ``one-grace`` and ``in-task-loss``): this release
# takes over only from 1.1.0 at peer version 1.1 (CHANGELOG.md, "Upgrade").
RELEASES = [p.stem for p in sorted(HISTORIES.glob("release-*.json"))]


@pytest.mark.parametrize(
    "name",
    [
        "liveness",
        "liveness-chunks",
        "liveness-peer-1.1",
        "liveness-in-task-loss",
        "liveness-one-grace",
        "collector",
        "collector-kinds-apart",
        "reap",
        "reap-in-task-loss",
        "fleet",
        "fleet-woken",
        *RELEASES,
    ],
)
async def test_stored_history_replays_on_current_code(name):
    failure = await replay_stored(HISTORIES / f"{name}.json")
    assert failure is None, failure
