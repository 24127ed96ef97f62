"""Who may speak for a worker (CONTRACT.md §5.2): signed heartbeats, pins, operator signals.

Time-skipping server, real workflows and Postgres. Each forged message is checked for what
it must not do: advance ``last_seq`` or ``boot_id``, mark or destroy a row, reap a task, or
fail a workflow task.
"""

from __future__ import annotations

import copy
import uuid
from datetime import timedelta
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from reaper.core.models import ReapInput, Report
from reaper.core.protocol import report_digest
from reaper.core.signing import (
    new_private_key,
    public_key_text,
    sign,
    sign_heartbeat,
    sign_operator_signal,
)
from tests.support.controller import controller, make_settings
from tests.support.fleet import Fleet, fleet_with
from tests.support.heartbeats import query_state, send
from tests.support.polling import eventually
from tests.support.scheduler import insert, rows, setup_service, task_states
from workflows.common import collector_id, liveness_id
from workflows.reap import WorkerReap

TTL = 300


async def failed_tasks(client: Client, workflow_id: str) -> int:
    """Workflow tasks of ``workflow_id`` that failed (a handler that raised, a sandbox error)."""
    n = 0
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        n += event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    return n


def forged(fleet: Fleet, w: str, **changes: Any) -> dict[str, Any]:
    """An unsigned beat for ``w`` with the agent's current boot id and ``changes``."""
    return {
        "worker": w,
        "boot_id": fleet.boot[w],
        "seq": fleet.seq[w] + 1,
        "sent_at": "2026-11-30T10:00:00Z",
        **changes,
    }


async def assert_unmoved(fleet: Fleet, w: str, boot: str, seq: int) -> None:
    st = await fleet.state(w)
    assert (st.boot_id, st.last_seq) == (boot, seq), "a rejected beat advanced the fence"
    marked = {h for h, since in (await rows(fleet.pool, "containers", w)).items() if since}
    assert not marked, f"a rejected beat marked {marked}"


async def test_forged_beats_change_nothing_for_a_pinned_worker(fleet):
    w = fleet.name("w")
    held = ["c-1", "c-2", "c-3"]
    await insert(fleet.pool, "containers", w, held)
    fleet.keys[w] = agent = new_private_key()
    st = await fleet.beat(w, containers=held)
    assert st.state == "running"
    await eventually(
        lambda: fleet.pool.fetchval(
            "SELECT public_key FROM reaper.agent_keys WHERE worker = $1", w
        ),
        lambda k: k == public_key_text(agent),
        what="key pinned",
    )
    boot, seq = fleet.boot[w], fleet.seq[w]
    other = new_private_key()
    genuine = sign_heartbeat(forged(fleet, w, containers=held), agent)
    tampered = {**genuine, "containers": []}  # signature no longer matches
    attempts = {
        "unsigned": forged(fleet, w, containers=[]),
        "huge seq": forged(fleet, w, seq=10**12),
        "new boot, empty lists": forged(fleet, w, boot_id="boot-evil", seq=0, containers=[]),
        "another key": sign_heartbeat(forged(fleet, w, boot_id="x", containers=[]), other),
        "pinned key, other's signature": {
            **sign_heartbeat(forged(fleet, w, containers=[]), other),
            "agent_key": public_key_text(agent),
        },
        "bad signature": tampered,
        "sig without key": {k: v for k, v in tampered.items() if k != "agent_key"},
        "null key": {**tampered, "agent_key": None},
        "malformed key": {**tampered, "agent_key": "not base64!"},
    }
    for what, payload in attempts.items():
        before = (await fleet.state(w)).rejected
        st = await fleet.raw(w, payload)
        assert st.rejected == before + 1, what
        await assert_unmoved(fleet, w, boot, seq)
    assert "pinned key" in (st.last_rejection or "") or "signature" in (st.last_rejection or "")
    # The genuine agent is not fenced out; a replay of its beat is dropped by the fence.
    st = await fleet.raw(w, genuine)
    assert st.last_seq == seq + 1
    fleet.seq[w] = seq + 1
    st = await fleet.raw(w, genuine)
    assert st.ignored >= 1 and st.last_seq == seq + 1
    await fleet.advance(TTL + 30, beating={w: {"containers": held}})
    assert set(await rows(fleet.pool, "containers", w)) == set(held), "a forged beat destroyed"
    assert await failed_tasks(fleet.client, liveness_id(w)) == 0


async def test_pin_survives_agent_restart(time_env, pool):
    async with fleet_with(time_env, pool) as fleet:
        w = fleet.name("w")
        fleet.keys[w] = new_private_key()
        await fleet.beat(w)
        fleet.reboot(w)  # state wiped, same key: accepted
        st = await fleet.beat(w)
        assert st.boot_id == fleet.boot[w]
        # The same agent without its key (a v1 agent, or an impostor): not heard.
        boot = fleet.boot[w]
        st = await fleet.raw(w, {"worker": w, "boot_id": "b2", "seq": 0, "containers": []})
        assert st.rejected == 1 and st.boot_id == boot


async def test_pin_survives_a_controller_restart_and_a_lost_run(time_env, pool):
    """The pin is in the liveness's state, which a restarted controller replays, and in
    Postgres, which a run that starts without it reads (here the old run was terminated).
    The first controller caches nothing, so it leaves no sticky queue for the second to wait
    out: the second rebuilds every workflow from its history, as after a crash."""
    tq = f"tq-{uuid.uuid4().hex[:8]}"
    settings = make_settings()
    fleet = Fleet(time_env, pool, tq)
    w = fleet.name("w")
    try:
        async with controller(time_env.client, pool, settings, tq, max_cached_workflows=0):
            fleet.keys[w] = new_private_key()
            await fleet.beat(w)
            await eventually(
                lambda: pool.fetchval(
                    "SELECT public_key FROM reaper.agent_keys WHERE worker = $1", w
                ),
                lambda k: k == public_key_text(fleet.keys[w]),
                what="key pinned",
            )
        async with controller(time_env.client, pool, settings, tq):  # nothing cached
            boot, seq = fleet.boot[w], fleet.seq[w]
            impostor = sign_heartbeat(
                forged(fleet, w, boot_id="boot-evil", seq=0, containers=[]), new_private_key()
            )
            st = await fleet.raw(w, impostor)
            assert st.rejected == 1
            await assert_unmoved(fleet, w, boot, seq)
            assert (await fleet.beat(w)).last_seq == seq + 1
            await time_env.client.get_workflow_handle(liveness_id(w)).terminate("run lost")
            await send(time_env.client, tq, impostor, worker=w)  # starts a new run
            st = await eventually(
                lambda: query_state(time_env.client, w),
                lambda s: s.rejected == 1,
                what="the new run rejects the impostor",
            )
            assert st.boot_id is None and st.last_seq is None
            assert (await fleet.beat(w)).state == "running"  # the genuine agent is heard
    finally:
        await fleet.close()


async def test_required_mode_registers_nobody_from_an_unsigned_beat(time_env, pool):
    async with fleet_with(time_env, pool, agent_auth="required") as fleet:
        w = fleet.name("w")
        st = await fleet.raw(w, {"worker": w, "boot_id": "b", "seq": 0, "containers": []})
        assert st.rejected == 1 and st.last_seq is None and st.boot_id is None
        assert await pool.fetchval("SELECT count(*) FROM reaper.workers WHERE name = $1", w) == 0
        fleet.keys[w] = new_private_key()
        st = await fleet.beat(w)
        assert st.state == "running"
        await eventually(
            lambda: pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", w),
            lambda s: s == "running",
            what="registered by a signed beat",
        )


async def test_enrolled_key_is_the_only_one_heard(time_env, pool):
    async with fleet_with(time_env, pool, agent_auth="required") as fleet:
        w = fleet.name("w")
        enrolled, intruder = new_private_key(), new_private_key()
        await pool.execute(
            "INSERT INTO reaper.agent_keys (worker, public_key) VALUES ($1, $2)",
            w,
            public_key_text(enrolled),
        )
        payload = sign_heartbeat({"worker": w, "boot_id": "b", "seq": 0}, intruder)
        st = await fleet.raw(w, payload)
        assert st.rejected == 1 and st.last_seq is None
        fleet.keys[w] = enrolled
        st = await fleet.beat(w)
        assert st.state == "running"


async def signal(fleet: Fleet, w: str, name: str, payload: dict[str, Any]) -> None:
    await fleet.client.get_workflow_handle(liveness_id(w)).signal(name, payload)


async def seen(fleet: Fleet, w: str, rejected: int) -> None:
    await eventually(
        lambda: query_state(fleet.client, w),
        lambda s: s.rejected == rejected,
        what=f"{rejected} rejections of {w}",
    )


async def test_operator_signals_in_required_mode(time_env, pool):
    operator = new_private_key()
    async with fleet_with(
        time_env, pool, agent_auth="required", operator_keys=public_key_text(operator)
    ) as fleet:
        w, x = fleet.name("w"), fleet.name("x")
        fleet.keys[w], fleet.keys[x] = new_private_key(), new_private_key()
        await setup_service(pool, "svc", {w: ["t-1"]})
        await fleet.beat(w, tasks=["t-1"])
        await fleet.beat(x, tasks=[])
        now = await time_env.get_current_time()

        def by(key: Any, target: str = w, at: Any = None, signal: Any = None) -> dict[str, Any]:
            # Time skips while the test waits: sign at the server's time of now.
            return sign_operator_signal({"reason": "test"}, target, key, at or fleet_now[0], signal)

        fleet_now = [now]

        async def tick() -> None:
            fleet_now[0] = await time_env.get_current_time()

        rejected = 0
        for what, payload in {
            "unsigned": {"reason": "test"},
            "worker's own key may not reap": by(fleet.keys[w]),
            "for another worker": by(operator, target=x),
            "stale": by(operator, at=now - timedelta(minutes=6)),
            "from the future": by(operator, at=now + timedelta(minutes=6)),
            "another key": by(new_private_key()),
            "tampered": {**by(operator), "worker": x},
            "signed for another signal": by(operator, signal="drain"),
        }.items():
            await signal(fleet, w, "force_reap", payload)
            rejected += 1
            await seen(fleet, w, rejected)
            assert (await fleet.state(w)).state == "running", what
        assert (await task_states(pool))["t-1"][1] == "running"
        # drain by the worker's own key acts; its replay after an undrain does not.
        await tick()
        drain = by(fleet.keys[w])
        await signal(fleet, w, "drain", drain)
        await eventually(lambda: fleet.state(w), lambda s: s.draining, what="drained")
        await tick()
        await signal(fleet, w, "undrain", by(operator, signal="undrain"))
        await eventually(lambda: fleet.state(w), lambda s: not s.draining, what="undrained")
        await signal(fleet, w, "drain", drain)
        rejected += 1
        await seen(fleet, w, rejected)
        assert not (await fleet.state(w)).draining
        # A valid operator signal acts.
        await tick()
        await signal(fleet, w, "force_reap", by(operator, signal="force_reap"))
        await eventually(
            lambda: task_states(pool),
            lambda t: t["t-1"][1] == "lost",
            what="forced reap done",
        )
        assert await failed_tasks(fleet.client, liveness_id(w)) == 0


async def test_pin_mode_accepts_unsigned_operator_signals(fleet):
    w = fleet.name("w")
    fleet.keys[w] = new_private_key()
    await fleet.beat(w)
    await signal(fleet, w, "drain", {"reason": "kernel upgrade"})
    await eventually(lambda: fleet.state(w), lambda s: s.draining, what="drained (v1 signal)")


async def test_retirement_clears_the_pin(time_env, pool):
    async with fleet_with(time_env, pool) as fleet:
        w = fleet.name("w")
        fleet.keys[w] = new_private_key()
        await fleet.beat(w)
        await signal(fleet, w, "retire", sign_operator_signal({}, w, fleet.keys[w]))
        await fleet.retired(w)  # the row, then the run's end (the old pin held till then)
        await eventually(
            lambda: pool.fetchval("SELECT count(*) FROM reaper.agent_keys WHERE worker = $1", w),
            lambda n: n == 0,
            what="pin deleted",
        )
        # The host is reinstalled: a new key and a new boot register it afresh.
        fleet.keys[w] = new_private_key()
        fleet.reboot(w)
        await eventually(lambda: fleet.beat(w), lambda s: s.state == "running", what="afresh")
        await eventually(
            lambda: pool.fetchval("SELECT public_key FROM reaper.agent_keys WHERE worker = $1", w),
            lambda k: k == public_key_text(fleet.keys[w]),
            what="the new key pinned",
        )


async def test_an_outsiders_forced_reap_child_reaps_nothing(fleet):
    w = fleet.name("w")
    await setup_service(fleet.pool, "svc", {w: ["t-1"]})
    await fleet.beat(w, tasks=["t-1"])
    result = await fleet.client.execute_workflow(
        WorkerReap.run,
        ReapInput(worker=w, reason="evil", actor="outsider", forced=True, lost_after=0.0),
        id=f"reap-{w}-99",
        task_queue=fleet.tq,
    )
    assert result.refused is not None
    assert (await task_states(fleet.pool))["t-1"][1] == "running"


def test_signature_covers_every_member():
    key = new_private_key()
    beat = sign_heartbeat({"worker": "w", "boot_id": "b", "seq": 1, "tasks": ["t"]}, key)
    from reaper.core.signing import verify

    assert verify(beat, beat["agent_key"])
    for member in ("worker", "boot_id", "seq", "tasks", "agent_key"):
        changed = copy.deepcopy(beat)
        changed[member] = ["x"] if member == "tasks" else 7 if member == "seq" else "z"
        assert not verify(changed, beat["agent_key"]), member
    assert verify(sign(dict(beat), key), beat["agent_key"])


async def test_a_report_an_outsider_signals_to_the_collector_marks_nothing(fleet):
    w = fleet.name("w")
    held = ["c-1", "c-2", "c-3"]
    await insert(fleet.pool, "containers", w, held)
    await fleet.beat(w, containers=held)
    gc = fleet.client.get_workflow_handle(collector_id(w))
    before = await gc.query("processed", result_type=int)
    now = await fleet.env.get_current_time()
    empty = Report(
        kind="containers", handles=[], taken_at=now, boot_id=fleet.boot[w], digest=report_digest([])
    )
    real = (await fleet.state(w)).report_digests["containers"]
    for report in (
        empty,  # no seal
        empty.model_copy(update={"seal": "0" * 64}),  # a made-up seal
        # a seal lifted from history does not fit other handles or another time
        empty.model_copy(update={"digest": real, "seal": "0" * 64}),
    ):
        await gc.signal("report", [report])
    await eventually(
        lambda: gc.query("processed", result_type=int),
        lambda n: n >= before + 3,
        what="forged reports handled",
    )
    assert not any((await rows(fleet.pool, "containers", w)).values()), "a forged report marked"
    events = await fleet.pool.fetchval("SELECT count(*) FROM reaper.events WHERE worker = $1", w)
    assert events == 1, "a forged report left a trace beyond the worker's registration"
    assert await failed_tasks(fleet.client, collector_id(w)) == 0
