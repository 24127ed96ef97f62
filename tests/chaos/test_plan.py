"""The campaign's planner and its agents: a host retired (or dead) in a round takes no
further action in that round, and a retired host comes back only as a new boot (CONTRACT.md
§5.1). Seed 31 at ``--peer-version 1.1``, 100 rounds: round 66 was "retire w1; silence w1
13.5"; the silence's end woke the retired boot, reaper rightly ignored its beats, and the
settle check reported "w1 beats but is retired". Reproduced on 2026-12-07 before the fix
(which host a round names follows the live fleet): round 66 "retire w2; silence w2 13.5",
then "w2 beats but is retired"."""

from __future__ import annotations

import asyncio
import random
from typing import Any, ClassVar

import pytest

from chaos.agents import Agents
from chaos.ledger import Ledger
from chaos.plan import AGENT_ACTIONS, Action, Fleet, plan_round
from chaos.settings import LOST_AFTER_S


class Scripted:
    """A stand-in for ``random.Random`` that returns the draws it is given, in order:
    ``choices`` the chosen value itself, ``random`` a float."""

    def __init__(self, *draws: Any) -> None:
        self.draws = list(draws)

    def choices(self, population: list[Any], weights: list[float]) -> list[Any]:
        value = self.draws.pop(0)
        assert value in population, (value, population)
        return [value]

    def random(self) -> float:
        value = self.draws.pop(0)
        assert isinstance(value, float), value
        return value


def fleet_of(n: int) -> Fleet:
    names = [f"w{i}" for i in range(n)]
    return Fleet(
        modes=dict.fromkeys(names, "active"),
        held={w: {"containers": [f"c-{w}"], "volumes": [], "tasks": [f"t-{w}"]} for w in names},
        draining=set(),
        busy=set(),
        replicas_alive=[True, True],
    )


SILENCE_13_5 = (13.5 - 1.0) / (LOST_AFTER_S + 8 - 1.0)
"""The ``extra`` draw of a silence of 13.5 s (``plan._agent_action``)."""


@pytest.mark.parametrize("first", ["retire", "die"])
def test_a_host_retired_or_dead_in_a_round_is_not_silenced_after_it(first: str) -> None:
    """Round 66's draws: two agent actions, the first on w1, the second a silence drawn
    on the same position of the active agents: it falls on another agent now."""
    rng = Scripted(2, first, 0.2, 0.0, "silence", 0.2, SILENCE_13_5, 0.99, 0.99)
    actions = plan_round(rng, fleet_of(6))  # type: ignore[arg-type]
    assert [str(a) for a in actions] == [f"{first} w1", "silence w2 13.5"]
    assert rng.draws == []  # the same draws as before: the rounds after stay aligned


def names_in(action: Action) -> set[str]:
    out: set[str] = set()
    for arg in action.args:
        if isinstance(arg, str):
            out.add(arg)
        elif isinstance(arg, tuple):
            out |= {a for a in arg if isinstance(a, str)}
    return out


def test_no_round_names_a_host_after_retiring_or_killing_it() -> None:
    """Over many seeds' rounds: once an action retires or kills a host, no later action of
    the round (a silence, a partition, a drop, a drain) names it."""
    assert {"retire", "die", "silence", "partition"} <= set(AGENT_ACTIONS)
    gone_then_named = []
    for seed in range(300):
        rng = random.Random(seed)
        for _ in range(20):
            fleet = fleet_of(8)
            gone: set[str] = set()
            for a in plan_round(rng, fleet):
                if names_in(a) & gone:
                    gone_then_named.append((seed, str(a), sorted(gone)))
                if a.what in ("retire", "die"):
                    gone.add(str(a.args[0]))
    assert gone_then_named == []


class Handle:
    async def signal(self, *args: Any, **kwargs: Any) -> None:
        return None


class Client:
    """Accepts every signal (a retire is delivered at once)."""

    def get_workflow_handle(self, workflow_id: str) -> Handle:
        return Handle()


async def test_a_retired_or_dead_host_is_not_woken_by_a_silence() -> None:
    """The runner's guard, should a plan ever ask it: a silence of a retired or dead host
    changes nothing, so no silence's end wakes its old boot; ``rejoin`` brings it back as a
    new boot."""
    agents = Agents(Client(), "tq", Ledger())  # type: ignore[arg-type]
    try:
        for name in ("w1", "w2"):
            agents.join(name)
        retired_boot = agents.agents["w1"].boot
        agents.retire("w1")
        agents.silence("w2", None)  # dies
        for name in ("w1", "w2"):
            agents.silence(name, 0.0)  # a silence that has ended already
        agents.before_round()  # wakes silent agents whose silence is over
        assert agents.agents["w1"].mode == "retired" and not agents.agents["w1"].beating
        assert agents.agents["w2"].mode == "dead" and not agents.agents["w2"].beating
        agents.rejoin("w1")
        assert agents.agents["w1"].beating and agents.agents["w1"].boot != retired_boot
    finally:
        await agents.close()


# ---- host rotations (CONTRACT.md §6) --------------------------------------------------


def test_rotations_come_only_at_1_2_and_after_the_rounds_other_draws() -> None:
    """With rotations off (peer version 1.1) no round rotates and services carry no
    max_surge; with them on, each round's other actions are what they would have been
    (the rotation is drawn last), and a rotation names an active host that runs tasks (its
    agent holds them, or Postgres shows them running) and does not drain."""

    def fleet(rotations: bool) -> Fleet:
        f = fleet_of(8)
        f.held["w0"]["tasks"] = []  # runs no task: never rotated
        f.held["w7"]["tasks"] = []  # its agent holds none, but Postgres shows two running
        f.running = {"w7": 2, "w1": 1}
        f.draining = {"w1"}  # drains already: never rotated
        f.rotations = rotations
        return f

    rotated = []
    for seed in range(200):
        off, on = random.Random(seed), random.Random(seed)
        before = [str(a) for a in plan_round(off, fleet(False))]
        assert not [a for a in before if a.startswith("rotate")]
        assert all(len(a.split()) == 3 for a in before if a.startswith("service"))
        after = plan_round(on, fleet(True))
        others = [str(a) for a in after if a.what not in ("rotate", "rotate-skipped", "service")]
        assert others == [a for a in before if not a.startswith("service")]
        rotated += [a for a in after if a.what == "rotate"]
    assert rotated, "no rotation in 200 rounds"
    assert {str(a.args[0]) for a in rotated} == {f"w{i}" for i in range(2, 8)}
    deadlines = [float(a.args[1]) for a in rotated]  # type: ignore[arg-type]
    assert min(deadlines) >= 2.0 and max(deadlines) < 90.0
    assert any(d < 6.0 for d in deadlines) and any(d >= 30.0 for d in deadlines)
    follow = {a.args[2] if len(a.args) > 2 else "" for a in rotated}
    assert follow == {"undrain", "retire", ""}


def test_a_rotation_drawn_when_no_host_runs_tasks_is_said_and_skipped() -> None:
    drawn = []
    for seed in range(100):
        f = fleet_of(6)
        for held in f.held.values():
            held["tasks"] = []
        f.rotations = True
        drawn += [a.what for a in plan_round(random.Random(seed), f) if "rotate" in a.what]
    assert drawn and set(drawn) == {"rotate-skipped"}


class Updates(Handle):
    """A liveness that answers every update as a migrating drain; ``asked`` keeps them."""

    asked: ClassVar[list[tuple[Any, ...]]] = []

    async def execute_update(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.asked.append(args)
        return {"accepted": True, "migrating": True}


class UpdatingClient(Client):
    def get_workflow_handle(self, workflow_id: str) -> Updates:
        return Updates()


@pytest.fixture
async def runner() -> Any:
    from chaos.actions import Runner

    agents = Agents(UpdatingClient(), "tq", Ledger())  # type: ignore[arg-type]
    for i in range(6):
        agents.join(f"w{i}")
    yield Runner(agents, None, None, agents.ledger)  # type: ignore[arg-type]
    await agents.close()


async def test_a_rotation_retires_its_host_once_drained(runner: Any) -> None:
    runner.run(Action("rotate", ("w1", 30.0, "retire")))
    a = runner.agents.agents["w1"]
    assert a.draining and not a.drained
    assert runner.follow_ups() == []  # not drained yet: the follow-up waits
    await asyncio.wait_for(runner.agents.commanding["w1"], 5)  # the update was answered
    update, payload = Updates.asked[-1]
    assert update == "drain" and payload["migrate"] is True and payload["deadline"] == "30000ms"
    assert runner.agents.ledger.counts["rotate migrating"] == 1
    a.drained = True  # its agent's state read says drained (§6.2)
    assert [str(x) for x in runner.follow_ups()] == ["rotate-retire w1"]
    assert a.mode == "retired" and runner.agents.ledger.retires["w1"]
    assert runner.pending == []


async def test_a_rotation_undrains_when_due_and_drops_what_was_overtaken(runner: Any) -> None:
    runner.run(Action("rotate", ("w1", 30.0, "undrain", 0.0)))
    runner.run(Action("rotate", ("w2", 30.0, "retire")))
    runner.agents.reboot("w2", wiped=False)  # a new boot: not the host that was rotated
    assert [str(x) for x in runner.follow_ups()] == ["rotate-undrain w1"]
    assert not runner.agents.agents["w1"].draining
    assert runner.pending == []  # w2's retire dropped with its boot
    assert runner.agents.ledger.counts["rotate retire dropped: rebooted"] == 1


async def test_a_retire_waits_while_its_host_is_silent_and_an_undrain_does_not(
    runner: Any,
) -> None:
    runner.run(Action("rotate", ("w1", 30.0, "retire")))
    runner.run(Action("rotate", ("w2", 30.0, "undrain", 0.0)))
    for name in ("w1", "w2"):
        runner.agents.silence(name, 60.0)
    runner.agents.agents["w1"].drained = True
    assert [str(x) for x in runner.follow_ups()] == ["rotate-undrain w2"]  # the operator's
    assert [f.name for f in runner.pending] == ["w1"]  # waits for w1 to beat again
    runner.agents.wake("w1")
    assert [str(x) for x in runner.follow_ups()] == ["rotate-retire w1"]


async def test_a_follow_up_retires_only_while_the_fleet_keeps_capacity(runner: Any) -> None:
    runner.run(Action("rotate", ("w1", 30.0, "retire")))
    runner.agents.agents["w1"].drained = True
    runner.agents.retire("w4")
    runner.agents.retire("w5")  # four agents beat, w1 among them
    assert runner.follow_ups() == []
    assert runner.pending  # kept until another host joins or its time runs out
