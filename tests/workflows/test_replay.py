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
from tests.support.heartbeats import send
from tests.support.releases import HISTORIES, replay_stored
from tests.support.scheduler import insert, setup_service

RECORD = os.environ.get("REAPER_RECORD_HISTORIES") == "1"


async def _record(fleet) -> None:
    """A life in short: beats, a mark, a destroy, a stall, a return, a reap."""
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
    ):
        history = await fleet.client.get_workflow_handle(wid).fetch_history()
        (HISTORIES / f"{name}.json").write_text(history.to_json())


async def _record_peer_1_1(fleet, monkeypatch) -> None:
    """A life under ``REAPER_PEER_VERSION=1.1`` (the suite's settings): steady beats whose
    tasks re-arm the deadline timer (``rearm-on-beat``), a report in six small chunks sent at
    once (``wide-staging``: staged together), two more queued behind a held chunk, the older
    dropped unstaged (``drop-superseded-chunks``), a stall and a return."""
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
    (HISTORIES / "liveness-peer-1.1.json").write_text(history.to_json())


HANDLES_1_1 = [f"c-{i:03d}" for i in range(1, 120)]


@pytest.mark.skipif(not RECORD, reason="set REAPER_RECORD_HISTORIES=1 to record")
async def test_record_histories(fleet):
    await _record(fleet)


@pytest.mark.skipif(not RECORD, reason="set REAPER_RECORD_HISTORIES=1 to record")
async def test_record_peer_1_1_history(fleet, monkeypatch):
    await _record_peer_1_1(fleet, monkeypatch)


# collector: kinds in turn, before the `kinds-apart` patch; collector-kinds-apart: after it.
# fleet: a fleet monitor recorded at commit 082a540, before the `repair-stuck` patch (two
# workers, one lost and reaped; not rewritten by REAPER_RECORD_HISTORIES).
# liveness-lean-start: the life above recorded at commit a51bfc2 (patch `lean-start`, row
# refreshes at half of STALL_AFTER as local activities), before `refresh-at-bound`.
# liveness-peer-1.1: a life recorded at REAPER_PEER_VERSION=1.1 (one-task-start,
# rearm-on-beat, wide-staging and drop-superseded-chunks, reaper/core/policy/rollout.py),
# commit after 362d144.
# liveness-one-grace: a dead worker's silence across two controller outages at
# REAPER_PEER_VERSION=1.1: the first late look grants the outage grace, the second declares
# it lost (``one-grace``); recorded by tests/e2e/test_outage.py
# (test_late_looks_in_one_silence_share_one_grace, REAPER_RECORD_HISTORIES=1).
# liveness-in-task-loss, reap-in-task-loss: a dead worker lost and reaped at
# REAPER_PEER_VERSION=1.1 with ``in-task-loss`` (the loss and the reap local activities);
# recorded by tests/workflows/test_in_task_loss.py (REAPER_RECORD_HISTORIES=1).
# release-<version>-*: what each release's controller wrote in the upgrade test
# (tests/e2e/test_upgrade.py records them with REAPER_RECORD_HISTORIES=1, from the release
# exported from git): every one of every release replays on the current code.
RELEASES = [p.stem for p in sorted(HISTORIES.glob("release-*.json"))]


@pytest.mark.parametrize(
    "name",
    [
        "liveness",
        "liveness-lean-start",
        "liveness-peer-1.1",
        "liveness-one-grace",
        "liveness-in-task-loss",
        "collector",
        "collector-kinds-apart",
        "reap",
        "reap-in-task-loss",
        "fleet",
        *RELEASES,
    ],
)
async def test_stored_history_replays_on_current_code(name):
    failure = await replay_stored(HISTORIES / f"{name}.json")
    assert failure is None, failure
