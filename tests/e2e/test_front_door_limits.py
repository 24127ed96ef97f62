"""Inputs at the front door's limits (CONTRACT.md §2: malformed input "is rejected with a
logged reason and changes nothing; it never fails or blocks the workflow").

- A beat whose ``seq`` does not fit Postgres' ``bigint`` and operator signals whose text
  holds NUL (which Postgres ``text`` cannot store), sent as raw JSON through the ``temporal``
  CLI: rejected as malformed (``reaper.core.contract``). Before, each was accepted and every
  write that carried it failed and was retried for ever: the liveness never judged its
  worker again (breaker findings, 2026-12-02).
- A burst of large complete reports that supersede each other before they are reconciled:
  the handles the superseded ones held are carried only up to
  ``policy.collection.ALSO_SEEN_MAX_BYTES``, beyond which every mark restarts. Before, six
  ~450 KB beats piled 2.76 MB into one command (Temporal's limit is 2 MB) and every
  workflow task of the liveness failed for ever.
- A worker name at 253 characters with 512-character handles: marked, destroyed, lost.

Dev server (session), real Postgres, in-process controller with short timings.
"""

from __future__ import annotations

import uuid

from tests.support import cli
from tests.support.controller import controller, make_settings
from tests.support.heartbeats import (
    beat,
    beats_handled,
    failed_tasks,
    query_state,
    register_with_task,
    send,
)
from tests.support.polling import eventually
from tests.support.scheduler import insert
from workflows.common import collector_id, liveness_id, reap_id

TIMINGS = dict(heartbeat_interval=1, stall_after=3, lost_after=6, missing_ttl=3, resync_interval=1)
LOST_BOUND = TIMINGS["lost_after"] + 2 * TIMINGS["heartbeat_interval"] + 15


async def _terminate(client, *workflow_ids: str) -> None:
    for wid in workflow_ids:
        try:
            await client.get_workflow_handle(wid).terminate("test over")
        except Exception:
            pass


async def test_what_postgres_cannot_store_is_rejected_and_blocks_nothing(dev_env, pool):
    client = dev_env.client
    address = client.service_client.config.target_host
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    suffix = uuid.uuid4().hex[:6]
    w = f"limits-{suffix}"
    async with controller(client, pool, make_settings(**TIMINGS), tq):
        try:
            await register_with_task(client, pool, tq, w, f"svc-{suffix}")
            before = await query_state(client, w)
            huge = f'{{"worker": "{w}", "boot_id": "boot-1", "seq": {2**63}, "tasks": []}}'
            await cli.signal(address, liveness_id(w), "heartbeat", huge)
            await cli.signal(address, liveness_id(w), "drain", '{"reason": "a\\u0000b"}')
            await cli.signal(address, liveness_id(w), "force_reap", '{"reason": "x\\u0000"}')
            st = await eventually(
                lambda: query_state(client, w),
                lambda s: s.rejected >= before.rejected + 3,
                timeout=30,
                what="the three inputs rejected",
            )
            assert (st.last_seq, st.state, st.draining) == (2, "running", False)
            assert "seq" in (st.last_rejection or "") or "NUL" in (st.last_rejection or "")
            # Nothing is blocked: a well-formed drain applies, and the worker, silent from
            # now on, is judged lost on time (rule 5; whether it is then reaped depends on
            # the disruption of the whole shared test database, rule 6).
            await cli.signal(address, liveness_id(w), "drain", '{"reason": "maintenance"}')
            row = await eventually(
                lambda: pool.fetchrow(
                    "SELECT state, draining, last_seq FROM reaper.workers WHERE name = $1", w
                ),
                lambda r: r["state"] == "lost",
                timeout=LOST_BOUND,
                poll=0.5,
                what="the silent worker lost",
            )
            assert (row["draining"], row["last_seq"]) == (True, 2)
            assert await failed_tasks(client, liveness_id(w)) == []
        finally:
            await _terminate(client, liveness_id(w), collector_id(w), reap_id(w, 1))


def _handles(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i:06}-" + "x" * (500 - len(prefix)) for i in range(n)]


async def test_a_253_character_worker_with_512_character_handles_is_collected(dev_env, pool):
    client = dev_env.client
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    tag = uuid.uuid4().hex[:6]
    w = (f"n{tag}." + "a:b-c_" * 50)[:253]
    assert len(w) == 253
    handles = [f"{tag}-{i}-" + "h" * 500 for i in range(3)]
    handles = [h[:512] for h in handles]
    await insert(pool, "containers", w, handles)
    async with controller(client, pool, make_settings(**TIMINGS), tq):
        try:
            seq = 0
            for _ in range(3):
                seq += 1
                await send(client, tq, beat(w, seq, containers=handles))
            await eventually(
                lambda: pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", w),
                lambda s: s == "running",
                timeout=30,
                what="the long-named worker registered",
            )

            # Drop one handle; keep beating until it is destroyed.
            async def beat_and_count():
                nonlocal seq
                seq += 1
                await send(client, tq, beat(w, seq, containers=handles[1:]))
                return await pool.fetchval(
                    "SELECT count(*) FROM reaper.containers WHERE worker = $1", w
                )

            await eventually(
                beat_and_count,
                lambda n: n == 2,
                timeout=30,
                poll=1.0,
                what="the dropped handle destroyed",
            )
            await eventually(
                lambda: pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", w),
                lambda s: s == "lost",
                timeout=30,
                poll=0.5,
                what="the silent long-named worker lost",
            )
            for wid in (liveness_id(w), collector_id(w)):
                assert await failed_tasks(client, wid) == [], wid
        finally:
            await _terminate(client, liveness_id(w), collector_id(w), reap_id(w, 1))


async def _state(client, w):
    try:
        return await query_state(client, w)
    except Exception:
        return None


async def test_a_burst_of_large_reports_never_fails_a_workflow_task(dev_env, pool):
    client = dev_env.client
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    w = f"big-{uuid.uuid4().hex[:6]}"
    async with controller(
        client, pool, make_settings(**{**TIMINGS, "stall_after": 30, "lost_after": 60}), tq
    ):
        try:
            for seq in range(1, 7):
                # ~450 KB of handles (under Temporal's 512 KB warning), a different list every beat.
                await send(client, tq, beat(w, seq, containers=_handles(f"s{seq}", 900)))
            await eventually(
                lambda: _state(client, w),
                lambda s: s is not None and s.last_seq == 6,
                timeout=60,
                poll=0.5,
                what="the sixth big beat handled",
            )
            await beats_handled(client, w, 0, timeout=120)  # and its report reconciled
            for wid in (liveness_id(w), collector_id(w)):
                assert await failed_tasks(client, wid) == [], wid
            desc = await client.get_workflow_handle(liveness_id(w)).describe()
            assert desc.status.name == "RUNNING"
        finally:
            await _terminate(client, liveness_id(w), collector_id(w))
