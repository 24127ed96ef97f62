"""The front door, fuzzed (CONTRACT.md §2 and §5.2): hypothesis-made malformed, mutated and
forged heartbeats and operator signals, sent through the SDK client to real workflows. None
fails or blocks a workflow task, none advances the fence, none changes a row.

One time-skipping server and one controller per test; every example goes to the same
workers, so what one example did is still there for the next to trip over.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reaper.core.signing import (
    new_private_key,
    public_key_text,
    sign_heartbeat,
    sign_operator_signal,
)
from tests.support.fleet import Fleet, fleet_with
from tests.support.heartbeats import query_state, send
from tests.support.polling import eventually
from tests.support.scheduler import insert, rows, setup_service, task_states
from workflows.common import liveness_id

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.text(max_size=30)
    | st.sampled_from(["", "w", "\x00", "🙂", "x" * 600, "2026-12-01T00:00:00Z"]),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)
MEMBERS = [
    "worker",
    "boot_id",
    "seq",
    "sent_at",
    "containers",
    "volumes",
    "tasks",
    "digests",
    "chunk",
    "agent_key",
    "sig",
    "signed_at",
    "reason",
    "signal",
]


@st.composite
def mutated(draw: st.DrawFn, genuine: dict[str, Any]) -> Any:
    """``genuine`` changed in one of the ways a broken or hostile sender would."""
    how = draw(st.sampled_from(["drop", "set", "add", "replace", "flip"]))
    payload = dict(genuine)
    if how == "drop":
        payload.pop(draw(st.sampled_from(sorted(genuine))), None)
    elif how == "set":
        payload[draw(st.sampled_from(MEMBERS))] = draw(json_values)
    elif how == "add":
        payload[draw(st.text(min_size=1, max_size=12))] = draw(json_values)
    elif how == "replace":
        return draw(json_values)
    else:
        sig = genuine.get("sig", "")
        i = draw(st.integers(0, max(len(sig) - 1, 0)))
        payload["sig"] = sig[:i] + ("A" if sig[i : i + 1] != "A" else "B") + sig[i + 1 :]
    return payload


class Pinned:
    """One pinned worker holding three containers, set up once per test."""

    def __init__(self) -> None:
        self.fleet: Fleet | None = None
        self.w = ""
        self.genuine: dict[str, Any] = {}

    async def ready(self, fleet: Fleet) -> Pinned:
        if self.fleet is fleet:
            return self
        self.fleet, self.w = fleet, fleet.name("w")
        await insert(fleet.pool, "containers", self.w, ["c-1", "c-2", "c-3"])
        fleet.keys[self.w] = key = new_private_key()
        await fleet.beat(self.w, containers=["c-1", "c-2", "c-3"])
        self.genuine = sign_heartbeat(
            {
                "worker": self.w,
                "boot_id": fleet.boot[self.w],
                "seq": fleet.seq[self.w] + 1,
                "containers": [],
            },
            key,
        )
        return self


PINNED = Pinned()


async def handled(fleet: Fleet, w: str, before: Any) -> Any:
    return await eventually(
        lambda: query_state(fleet.client, w),
        lambda s: (
            s.rejected + s.ignored > before.rejected + before.ignored
            or s.last_seq != before.last_seq
        ),
        what="the fuzzed message handled",
    )


@FUZZ
@given(data=st.data())
async def test_mutated_heartbeats_change_nothing(fleet, data):
    p = await PINNED.ready(fleet)
    payload = data.draw(mutated(p.genuine))
    if payload == p.genuine:
        return
    before = await fleet.state(p.w)
    await send(fleet.client, fleet.tq, payload, worker=p.w)
    after = await handled(fleet, p.w, before)
    assert (after.boot_id, after.last_seq) == (before.boot_id, before.last_seq)
    assert after.state == "running" and after.missing == 0
    assert not any((await rows(fleet.pool, "containers", p.w)).values())


class Operated:
    """A running worker with one task, under ``required``, set up once per test."""

    def __init__(self) -> None:
        self.fleet: Fleet | None = None
        self.w = ""
        self.operator = new_private_key()

    async def ready(self, fleet: Fleet) -> Operated:
        if self.fleet is fleet:
            return self
        self.fleet, self.w = fleet, fleet.name("w")
        fleet.keys[self.w] = new_private_key()
        await setup_service(fleet.pool, "svc", {self.w: ["t-1"]})
        await fleet.beat(self.w, tasks=["t-1"])
        return self


OPERATED = Operated()


@pytest_asyncio.fixture
async def required_fleet(time_env, pool) -> AsyncIterator[Fleet]:
    """A controller in ``required`` mode that knows ``OPERATED.operator``'s public key."""
    async with fleet_with(
        time_env, pool, agent_auth="required", operator_keys=public_key_text(OPERATED.operator)
    ) as f:
        yield f


@FUZZ
@given(data=st.data())
async def test_mutated_operator_signals_change_nothing(required_fleet, data):
    await OPERATED.ready(required_fleet)
    o = OPERATED
    assert o.fleet is not None
    fleet = o.fleet
    name = data.draw(st.sampled_from(["force_reap", "drain", "undrain", "retire"]))
    now = await fleet.env.get_current_time()
    genuine = sign_operator_signal({"reason": "fuzz"}, o.w, o.operator, now, name)
    payload = data.draw(mutated(genuine))
    if isinstance(payload, dict) and payload.get("sig") == genuine["sig"]:
        return  # the genuine signature on (maybe) other members: covered by test_signed
    before = await fleet.state(o.w)
    await fleet.client.get_workflow_handle(liveness_id(o.w)).signal(name, payload)
    await eventually(
        lambda: query_state(fleet.client, o.w),
        lambda s: s.rejected > before.rejected,
        what=f"mutated {name} rejected",
    )
    st_ = await fleet.state(o.w)
    assert (st_.state, st_.draining) == ("running", False)
    assert (await task_states(fleet.pool))["t-1"][1] == "running"
