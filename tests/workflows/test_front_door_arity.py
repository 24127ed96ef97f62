"""The front door, by arity: whatever a sender adds can wedge no worker (issue 18).

Every workflow type gets 0 to 5 arguments of arbitrary JSON under every signal name it
knows and under names it does not, through the SDK client. None fails a workflow task, none
changes a row, the extra arguments and unknown names are counted
(``reaper_signals_ignored_total``), and the worker's next ordinary beat is applied. A beat
with a second argument (a newer agent's labels) is applied as a beat, and so is the first
signal-with-start of a new worker that carries two. The same through the ``temporal`` CLI:
tests/e2e/test_front_door_cli.py.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy

from activities.metrics import SIGNALS_IGNORED
from reaper.core.models import ReapResult
from reaper.core.signing import new_private_key, public_key_text
from tests.support.fleet import fleet_with
from tests.support.heartbeats import BENIGN, beat, query_state, send
from tests.support.polling import eventually
from tests.support.scheduler import insert, rows, setup_service, task_states
from workflows import WorkerReap
from workflows.common import collector_id, fleet_monitor_id, liveness_id

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=30)
    | st.sampled_from(["", "containers", "\x00", "🙂", "x" * 600, "2026-12-01T00:00:00Z"]),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)
UNKNOWN = st.sampled_from(["labels", "heartbeat_v2", "HEARTBEAT", "", "s" * 300, "🙂"]) | st.text(
    max_size=20
)
KNOWN = {
    "WorkerLiveness": [
        "heartbeat",
        "force_reap",
        "drain",
        "undrain",
        "retire",
        "gc_status",
        "want_report",
        "nudge",
        "gc_stopped",
    ],
    "HandleCollector": ["report"],
    "FleetMonitor": [],
}
"""Signal names each workflow type knows (the collector's ``stop`` ends it by design: an
internal signal that needs no argument, sent apart below)."""


def messages(kind: str, n: int) -> list[tuple[str, list[Any]]]:
    """``n`` signals for a workflow of ``kind``: a known or unknown name and 0-5 arguments of
    arbitrary JSON. Derandomized: the same messages on every run."""
    drawn: list[tuple[str, list[Any]]] = []
    names = st.sampled_from(KNOWN[kind]) | UNKNOWN if KNOWN[kind] else UNKNOWN

    @settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(names, st.lists(json_values, max_size=5))
    def draw(name: str, args: list[Any]) -> None:
        drawn.append((name, args))

    draw()
    return drawn[:n]


def ignored(kind: str, why: str) -> float:
    return SIGNALS_IGNORED.labels(kind, why)._value.get()


async def handled(handle: WorkflowHandle) -> None:
    """Wait until every signal in ``handle``'s history was followed by a completed task."""

    async def last_ids() -> tuple[int, int]:
        signal = done = 0
        async for e in handle.fetch_history_events():
            name = e.WhichOneof("attributes") or ""
            if name.startswith("workflow_execution_signaled"):
                signal = e.event_id
            elif name.startswith("workflow_task_completed"):
                done = e.event_id
        return signal, done

    await eventually(last_ids, lambda ids: ids[1] > ids[0], what="signals handled")


async def no_failed_tasks(client: Client, *ids: str) -> None:
    """No workflow task of the current runs of ``ids`` failed (the time-skipping server has
    no visibility to list earlier runs)."""
    for wid in ids:
        failed = [
            e.workflow_task_failed_event_attributes.failure.message
            async for e in client.get_workflow_handle(wid).fetch_history_events()
            if e.HasField("workflow_task_failed_event_attributes")
            and e.workflow_task_failed_event_attributes.cause not in BENIGN
        ]
        assert failed == [], wid


async def test_any_arity_under_any_name_wedges_no_workflow(time_env, pool):
    """0-5 arguments of arbitrary JSON, known and unknown names, on the liveness, its
    collector and the fleet monitor (``required`` mode: an operator signal must be signed, so
    no random object can act as one)."""
    operator = new_private_key()
    async with fleet_with(
        time_env,
        pool,
        monitor=True,
        agent_auth="required",
        operator_keys=public_key_text(operator),
    ) as fleet:
        w = fleet.name("w")
        fleet.keys[w] = new_private_key()
        await insert(fleet.pool, "containers", w, ["c-1", "c-2"])
        await setup_service(fleet.pool, "svc", {w: ["t-1"]})
        await fleet.beat(w, containers=["c-1", "c-2"], tasks=["t-1"])
        before_rows = (await rows(fleet.pool, "containers", w), await task_states(fleet.pool))
        before = await fleet.state(w)
        targets = {
            "WorkerLiveness": liveness_id(w),
            "HandleCollector": collector_id(w),
            "FleetMonitor": fleet_monitor_id(fleet.tq),
        }
        sent: Counter[tuple[str, str]] = Counter()
        for kind, wid in targets.items():
            extra0, unknown0 = ignored(kind, "extra-arguments"), ignored(kind, "unknown-signal")
            handle = fleet.client.get_workflow_handle(wid)
            for name, args in messages(kind, 40):
                await handle.signal(name, args=args)
                known = name in KNOWN[kind]
                sent[kind, "known" if known else "unknown"] += 1
                sent[kind, "extra"] += known and len(args) > 1
            await handled(handle)
            assert ignored(kind, "extra-arguments") - extra0 == sent[kind, "extra"]
            assert ignored(kind, "unknown-signal") - unknown0 == sent[kind, "unknown"]
        await no_failed_tasks(fleet.client, *targets.values())
        # Nothing moved: the fence, the state, the rows.
        after = await fleet.state(w)
        assert (after.boot_id, after.last_seq, after.state) == (
            before.boot_id,
            before.last_seq,
            "running",
        )
        assert not after.draining
        assert (await rows(fleet.pool, "containers", w), await task_states(fleet.pool)) == (
            before_rows
        )
        # The worker's next ordinary beat is applied, and reconciled.
        st_ = await fleet.beat(w, containers=["c-1", "c-2"], tasks=["t-1"])
        assert st_.last_seq == before.last_seq + 1
        print("signals sent by workflow type:", dict(sent))


async def test_a_beat_with_a_second_argument_is_applied(fleet):
    """A newer agent adds labels beside the payload: the beat counts, the labels are ignored."""
    w = fleet.name("w")
    await fleet.beat(w)
    extra = ignored("WorkerLiveness", "extra-arguments")
    handle = fleet.client.get_workflow_handle(liveness_id(w))
    await handle.signal("heartbeat", args=[beat(w, 1, fleet.boot[w]), {"labels": {"zone": "a"}}])
    st_ = await eventually(
        lambda: query_state(fleet.client, w), lambda s: s.last_seq == 1, what="beat 1 applied"
    )
    assert st_.rejected == 0 and st_.state == "running"
    assert ignored("WorkerLiveness", "extra-arguments") == extra + 1
    # A query with arguments is answered too.
    assert (await handle.query("state", args=["extra", 2]))["last_seq"] == 1
    await no_failed_tasks(fleet.client, liveness_id(w))


async def test_a_new_worker_whose_first_signal_carries_two_arguments_registers(fleet):
    w = fleet.name("w")
    await fleet.client.start_workflow(
        "WorkerLiveness",
        {"worker": w},
        id=liveness_id(w),
        task_queue=fleet.tq,
        start_signal="heartbeat",
        start_signal_args=[beat(w, 0, "b-1"), {"labels": {"zone": "a"}}],
    )
    st_ = await eventually(
        lambda: query_state(fleet.client, w), lambda s: s.last_seq == 0, what="registered"
    )
    assert (st_.state, st_.boot_id) == ("running", "b-1")
    await no_failed_tasks(fleet.client, liveness_id(w))


async def test_a_start_input_of_any_shape_still_speaks_for_the_worker_its_id_names(fleet):
    """A signal-with-start whose start input is junk, or several arguments: the liveness
    takes its worker from its id (``liveness-{worker}``) and registers it."""
    for i, start_args in enumerate([[], [{"wrkr": 1}], [17, "x", None], [{"worker": 5}]]):
        w = fleet.name(f"s{i}")
        malformed = ignored("WorkerLiveness", "malformed-start")
        await fleet.client.start_workflow(
            "WorkerLiveness",
            args=start_args,
            id=liveness_id(w),
            task_queue=fleet.tq,
            start_signal="heartbeat",
            start_signal_args=[beat(w, 0, "b-1")],
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        st_ = await eventually(
            lambda w=w: query_state(fleet.client, w), lambda s: s.last_seq == 0, what="registered"
        )
        assert st_.state == "running"
        assert (
            await fleet.pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", w)
        ) == ("running")
        assert ignored("WorkerLiveness", "malformed-start") == malformed + 1
        await no_failed_tasks(fleet.client, liveness_id(w))


async def test_a_reap_started_with_junk_reaps_nothing(fleet):
    """``WorkerReap`` started by hand with arguments that are not a ``ReapInput``: it ends
    refused, and no task moves."""
    w = fleet.name("w")
    await setup_service(fleet.pool, "svc", {w: ["t-9"]})
    await fleet.beat(w, tasks=["t-9"])
    for i, args in enumerate([[], [{"worker": w}], [{"worker": w}, 1, 2, 3, 4]]):
        result = await fleet.client.execute_workflow(
            WorkerReap.run,
            args=args,
            id=f"reap-fuzz-{fleet.suffix}-{i}",
            task_queue=fleet.tq,
            result_type=ReapResult,
        )
        assert result.refused == "malformed input"
    assert (await task_states(fleet.pool))["t-9"][1] == "running"


async def test_the_collector_stopped_by_a_stranger_is_started_again(fleet):
    """``stop`` is an internal signal anyone in the namespace can send, with any arguments:
    the collector ends, and the liveness starts a new one with its next report; nothing is
    lost and no task fails."""
    w = fleet.name("w")
    await insert(fleet.pool, "containers", w, ["c-1"])
    await fleet.beat(w, containers=["c-1"])
    await fleet.client.get_workflow_handle(collector_id(w)).signal("stop", args=[1, {"x": 2}])
    await eventually(
        lambda: fleet.client.get_workflow_handle(collector_id(w)).describe(),
        lambda d: d.status is not None and d.status.name == "COMPLETED",
        what="collector stopped",
    )
    await send(fleet.client, fleet.tq, beat(w, 1, fleet.boot[w], containers=[]))
    # A new collector reconciled that report: c-1 is marked missing.
    await eventually(
        lambda: rows(fleet.pool, "containers", w),
        lambda r: r["c-1"] is not None,
        what="c-1 marked missing by a new collector",
    )
    await no_failed_tasks(fleet.client, liveness_id(w), collector_id(w))
