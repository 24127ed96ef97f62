"""Reports of any size without a payload over 256 KiB (chunks, digests, staging)."""

from __future__ import annotations

from reaper.core import protocol
from reaper.core.protocol import build_beats, report_digest
from tests.support.scheduler import insert

TTL = 300
PAYLOAD_LIMIT = 256 * 1024


async def send_all(fleet, worker: str, lists: dict, digests: dict | None = None) -> list[dict]:
    fleet.seq.setdefault(worker, -1)
    fleet.boot.setdefault(worker, "boot-large")
    beats = build_beats(worker, fleet.boot[worker], fleet.seq[worker] + 1, lists, digests)
    for b in beats:
        await fleet.raw(worker, b)
    fleet.seq[worker] = beats[-1]["seq"]
    await fleet.settle(worker)
    return beats


async def marked(pool, worker: str) -> int:
    return await pool.fetchval(
        "SELECT count(*) FROM reaper.containers WHERE worker = $1 AND missing_since IS NOT NULL",
        worker,
    )


async def max_payload(client, workflow_id: str) -> int:
    biggest = 0
    async for ev in client.get_workflow_handle(workflow_id).fetch_history_events():
        for field in (
            "workflow_execution_signaled_event_attributes",
            "activity_task_scheduled_event_attributes",
            "signal_external_workflow_execution_initiated_event_attributes",
            "workflow_execution_started_event_attributes",
            "activity_task_completed_event_attributes",
        ):
            if ev.HasField(field):
                attrs = getattr(ev, field)
                payloads = getattr(attrs, "input", None) or getattr(attrs, "result", None)
                if payloads is not None:
                    biggest = max(biggest, payloads.ByteSize())
    return biggest


async def test_large_report_in_chunks_marks_only_what_is_missing_and_no_payload_exceeds_256k(fleet):
    w = fleet.name("w")
    # 40,000 handles, 7 chunks: big enough for chunks near their 128 KiB limit, small enough
    # that the liveness's history stays under the size at which the time-skipping server
    # suggests continue-as-new; that server mishandles chunk signals that arrive while a run
    # continues as new (seen under CPU load; the real server refuses such a completion and
    # hands the signals to the new task, which tests/test_durable.py covers on the dev server).
    handles = [f"container-{i:07d}" for i in range(40_000)]
    await fleet.pool.execute(
        "INSERT INTO reaper.containers (handle, worker) SELECT unnest($1::text[]), $2", handles, w
    )
    beats = await send_all(fleet, w, {"containers": handles})
    assert len(beats) > 5 and all("chunk" in b for b in beats[:-1])
    st = await fleet.state(w)
    assert st.report_digests["containers"] == report_digest(handles)
    assert await marked(fleet.pool, w) == 0
    gone = set(handles[::100])  # 1% changed
    now = [h for h in handles if h not in gone]
    await fleet.advance(10)
    await send_all(fleet, w, {"containers": now}, st.report_digests)
    assert await marked(fleet.pool, w) == len(gone)
    for wid in (f"liveness-{w}", f"gc-{w}"):
        assert await max_payload(fleet.client, wid) < PAYLOAD_LIMIT, wid
    # Unchanged from here on: digest-only beats carry no handle, yet count as complete
    # reports, so the TTL runs out and the missing ones are destroyed.
    for _ in range((TTL + 40) // 10):
        await fleet.advance(10)
        st = await fleet.state(w)
        beats = await send_all(fleet, w, {"containers": now}, st.report_digests)
        assert len(beats) == 1 and "containers" not in beats[0] and "digests" in beats[0]
    left = await fleet.pool.fetchval("SELECT count(*) FROM reaper.containers WHERE worker=$1", w)
    assert left == len(now)


async def test_incomplete_chunked_report_never_marks(fleet):
    w = fleet.name("w")
    handles = [f"volume-{i:07d}" for i in range(30_000)]  # 4 chunks (see above)
    await fleet.pool.execute(
        "INSERT INTO reaper.containers (handle, worker) SELECT unnest($1::text[]), $2", handles, w
    )
    await send_all(fleet, w, {"containers": handles})
    fleet.seq[w] += 1
    beats = build_beats(w, fleet.boot[w], fleet.seq[w], {"containers": handles[:-5000]}, None)
    assert len(beats) >= 3
    for b in beats[:-2]:  # the last chunk never arrives
        await fleet.raw(w, b)
    await fleet.raw(w, {**beats[-1], "containers": None})
    fleet.seq[w] = beats[-1]["seq"]
    await fleet.advance(TTL + 30, step=10, beating={w: {}})
    assert await marked(fleet.pool, w) == 0
    st = await fleet.state(w)
    assert st.report_digests["containers"] == report_digest(handles)


async def test_chunked_report_whose_handles_do_not_match_its_digest_is_rejected(fleet):
    w = fleet.name("w")
    handles = [f"c-{i:06d}-{'z' * 60}" for i in range(8_000)]
    await fleet.pool.execute(
        "INSERT INTO reaper.containers (handle, worker) SELECT unnest($1::text[]), $2", handles, w
    )
    beats = build_beats(w, "boot-x", 0, {"containers": handles[:4000]}, None)
    for b in beats[:-1]:
        b["chunk"]["digest"] = report_digest(handles)  # lies about its content
    fleet.boot[w], fleet.seq[w] = "boot-x", -1
    for b in beats:
        await fleet.raw(w, b)
    st = await fleet.settle(w)
    assert st.rejected == 1 and "do not match digest" in st.last_rejection
    assert await marked(fleet.pool, w) == 0
    assert "containers" not in st.report_digests


async def test_plain_v1_report_too_large_to_keep_is_staged(fleet):
    w = fleet.name("w")
    handles = [f"c-{i:06d}" for i in range(12_000)]  # ~130 KB inline: staged, not kept
    await fleet.pool.execute(
        "INSERT INTO reaper.containers (handle, worker) SELECT unnest($1::text[]), $2", handles, w
    )
    await fleet.beat(w, containers=handles[:-10])
    assert await marked(fleet.pool, w) == 10
    n = await fleet.pool.fetchval("SELECT count(*) FROM reaper.report_chunks WHERE worker=$1", w)
    assert n >= 2
    # the forwarded report signal to the collector carries no handles
    assert await max_payload(fleet.client, f"gc-{w}") < 16 * 1024


async def test_chunks_of_a_superseded_report_are_never_staged_and_the_newest_restarts_marks(
    fleet, monkeypatch
):
    """``drop-superseded-chunks`` (the suite's peer version is 1.1): reports queue behind a
    chunk held in Postgres (the test holds the lock each ``stage_chunk`` takes after its
    insert); once it is released only the newest report's chunks are staged, and that
    report restarts every mark of its kind, because an older report it superseded unread
    may have seen a marked handle (rule 4: a handle absent from every complete report for
    the TTL). Without the drop a backlog like the breaker's (ten 22-chunk reports behind a
    held task) staged every chunk, past Temporal's 50 MB history limit."""
    monkeypatch.setattr(protocol, "INLINE_MAX_BYTES", 256)
    monkeypatch.setattr(protocol, "CHUNK_MAX_BYTES", 400)
    w = fleet.name("w")
    handles = [f"c-{i:04d}" for i in range(200)]
    await insert(fleet.pool, "containers", w, handles)
    # c-0000 was marked long ago: its TTL ran out. The first report holds it (it is back),
    # the newest lacks it again: its clock restarts instead of destroying it at once.
    await fleet.pool.execute(
        "UPDATE reaper.containers SET missing_since = '2000-01-01' WHERE handle = 'c-0000'"
    )
    await fleet.beat(w)
    first = build_beats(w, fleet.boot[w], fleet.seq[w] + 1, {"containers": handles}, None)
    second = build_beats(w, fleet.boot[w], first[-1]["seq"] + 1, {"containers": handles[5:]}, None)
    newest = build_beats(w, fleet.boot[w], second[-1]["seq"] + 1, {"containers": handles[1:]}, None)
    reports = [[b for b in beats if "chunk" in b] for beats in (first, second, newest)]
    assert all(len(chunks) >= 3 for chunks in reports)
    async with fleet.staging_held(w):
        for beat in first + second + newest:
            await fleet.took(w, beat)
        held = await fleet.staged_chunks(w)
    fleet.seq[w] = newest[-1]["seq"]
    st = await fleet.settle(w, lambda s: s.last_seq == fleet.seq[w])
    staged = await fleet.staged_chunks(w)
    newest_id = reports[2][0]["chunk"]["report_id"]
    after = staged[len(held) :]
    assert after == [(newest_id, i) for i in range(len(reports[2]))], (held, after)
    assert st.report_digests["containers"] == report_digest(handles[1:]) and st.rejected == 0
    row = await fleet.pool.fetchrow(
        "SELECT missing_since FROM reaper.containers WHERE handle = 'c-0000'"
    )
    assert row is not None and row["missing_since"].year > 2000  # restarted, not destroyed
    assert await marked(fleet.pool, w) == 1


async def test_a_newest_report_equal_to_the_last_reconciled_still_restarts_what_a_dropped_one_saw(
    fleet, monkeypatch
):
    """The newest report lacks a marked handle, as the last reconciled one did, but a
    report dropped unstaged between them held it: the newest is reconciled anyway and the
    handle's clock restarts, so it outlives the TTL counted from its first mark (rule 4).
    Left unreconciled as "unchanged", the handle would be destroyed at that first mark's
    TTL although the worker reported it in between."""
    monkeypatch.setattr(protocol, "INLINE_MAX_BYTES", 256)
    monkeypatch.setattr(protocol, "CHUNK_MAX_BYTES", 400)
    w = fleet.name("w")
    handles = [f"c-{i:04d}" for i in range(200)]
    await insert(fleet.pool, "containers", w, handles)
    await fleet.beat(w, containers=handles[1:])  # c-0000 marked now
    first_mark = await fleet.pool.fetchval(
        "SELECT missing_since FROM reaper.containers WHERE handle = 'c-0000'"
    )
    assert first_mark is not None
    await fleet.advance(TTL - 50, beating={w: {"containers": handles[1:]}})
    held = build_beats(w, fleet.boot[w], fleet.seq[w] + 1, {"containers": handles}, None)
    again = build_beats(w, fleet.boot[w], held[-1]["seq"] + 1, {"containers": handles[1:]}, None)
    async with fleet.staging_held(w):
        for beat in held + again:
            await fleet.took(w, beat)
    fleet.seq[w] = again[-1]["seq"]
    await fleet.settle(w, lambda s: s.last_seq == fleet.seq[w])
    await fleet.advance(100, beating={w: {"containers": handles[1:]}})  # past the first TTL
    mark = await fleet.pool.fetchval(
        "SELECT missing_since FROM reaper.containers WHERE handle = 'c-0000'"
    )
    assert mark is not None and mark > first_mark  # restarted, not destroyed
