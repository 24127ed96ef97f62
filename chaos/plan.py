"""What each round does, drawn from the campaign's ``random.Random(seed)``.

Only the main loop draws, in a fixed order, from what the campaign itself decided (which
agents are silent, dead, retired, which replicas are down): the choices of a campaign
follow from its seed. (Which handle an agent drops is drawn from what it holds, which
includes tasks the controller assigned; the kind of each choice and its timing do not
depend on that.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TypeVar

from chaos.faults import LOCKABLE, ROW_LOCKS
from chaos.settings import AGENTS_MAX, LOST_AFTER_S, MISSING_TTL_S, STALL_AFTER_S
from reaper.core import kinds
from reaper.core.contract import KINDS

T = TypeVar("T")

AGENT_ACTIONS = {
    "drop": 10,
    "flap": 5,
    "silence": 6,
    "reboot": 3,
    "wipe": 2,
    "stray": 2,
    "drain": 3,
    "undrain": 3,
    "retire": 2,
    "rejoin": 3,
    "die": 1,
    "revive": 2,
    "join": 2,
    "partition": 1,
}
"""Relative weights of what an agent (or, for ``partition``, most of the fleet) does."""
SCHEDULER_ACTIONS = {"handle": 6, "two-phase": 3, "phantom": 2, "creating": 1, "service": 4}
FAULTS = {
    "kill": 40,
    "kill-both": 8,
    "temporal": 10,
    "postgres-crash": 6,
    "postgres-fast": 4,
    "lock": 12,
    "sleep": 10,
    "terminate": 10,
}
FAULT_CHANCE = 0.6
"""Chance that a round starts a fault."""
SCHEDULER_CHANCE = 0.6
"""Chance that a round has a scheduler insert."""
ROTATE_CHANCE = 0.3
"""At peer version 1.2 (CONTRACT.md §6, ``Fleet.rotations``): chance that a round starts a
host rotation. Drawn after the round's fault, and only then: a 1.1 campaign draws as
before."""
ROTATE_DEADLINES = ((0.25, (2.0, 6.0)), (0.5, (6.0, 20.0)), (1.0, (30.0, 90.0)))
"""A rotation's deadline, seconds: ``(below, (low, high))``: a draw below ``below`` (and
above the band before) gives a deadline in ``[low, high)``. The first band fires before the
first wave can run (every original stopped at the deadline and backfilled; 2 s is the least
``2 x HEARTBEAT_INTERVAL`` allows), the second often in mid-migration, the third seldom
(the host drains first, faults permitting)."""
ROTATE_THEN = ((0.3, "undrain"), (0.65, "retire"), (1.0, ""))
"""What follows a rotation, by a draw as above: ``undrain`` ``UNDRAIN_AFTER_S`` later (in
mid-migration or after it), ``retire`` once its agent reads ``drained`` (an autoscaler
terminating the host, then retiring it), or nothing (it stays drained until the quiet
period undrains it)."""
UNDRAIN_AFTER_S = (1.0, 10.0)
MAX_DEAD = 2
"""Agents dead at once at most: with six or more agents, dead ones alone never reach the
disruption threshold, so the final state can be checked with reaps allowed."""


@dataclass(frozen=True)
class Action:
    """One thing to do: ``what`` and its arguments."""

    what: str
    args: tuple[object, ...] = ()

    def __str__(self) -> str:
        return " ".join(
            [self.what, *(f"{a:.1f}" if isinstance(a, float) else str(a) for a in self.args)]
        )


@dataclass
class Fleet:
    """What the planner knows of the fleet: agents by mode, what each holds, replicas."""

    modes: dict[str, str]
    held: dict[str, dict[str, list[str]]]
    draining: set[str]
    busy: set[str]
    replicas_alive: list[bool]
    counter: list[int] = field(default_factory=lambda: [0])
    retired_seen: set[str] = field(default_factory=set)
    """Workers Postgres shows ``retired``: only those rejoin (a retire still in flight
    when the host comes back retires the new boot; see docs/chaos.md, the findings)."""
    rotations: bool = False
    """Whether rounds rotate hosts: peer version 1.2, whose ``drain`` migrates (§6.1)."""
    running: dict[str, int] = field(default_factory=dict)
    """Per worker, its tasks Postgres showed ``running`` at the checker's latest read (what a
    migration moves; an agent may hold a task before its report made it run)."""
    gone: set[str] = field(default_factory=set)
    """Hosts retired or killed by this round's plan so far (:func:`plan_round` moves them
    to ``modes`` ``retired`` or ``dead`` as it plans): nothing else of the round names them."""

    def names(self, *modes: str) -> list[str]:
        return sorted(n for n, m in self.modes.items() if m in modes)

    def fresh(self, prefix: str) -> str:
        self.counter[0] += 1
        return f"{prefix}-{self.counter[0]}"


def plan_round(rng: random.Random, fleet: Fleet) -> list[Action]:
    """The actions of one round: zero to two agent actions, maybe a scheduler insert,
    maybe a fault. Draws a fixed number of values per decision so rounds stay aligned."""
    actions: list[Action] = []
    for _ in range(rng.choices([0, 1, 2], [3, 5, 2])[0]):
        what = rng.choices(list(AGENT_ACTIONS), list(AGENT_ACTIONS.values()))[0]
        pick, extra = rng.random(), rng.random()
        a = _agent_action(what, pick, extra, fleet)
        if a is not None:
            actions.append(a)
            _gone(a, fleet)
    if rng.random() < SCHEDULER_CHANCE:
        what = rng.choices(list(SCHEDULER_ACTIONS), list(SCHEDULER_ACTIONS.values()))[0]
        pick, extra = rng.random(), rng.random()
        a = _scheduler_action(what, pick, extra, fleet)
        if a is not None:
            actions.append(a)
    if rng.random() < FAULT_CHANCE:
        what = rng.choices(list(FAULTS), list(FAULTS.values()))[0]
        pick, extra = rng.random(), rng.random()
        a = _fault(what, pick, extra, fleet)
        if a is not None:
            actions.append(a)
    if fleet.rotations and rng.random() < ROTATE_CHANCE:
        pick, extra, then = rng.random(), rng.random(), rng.random()
        a = _rotate(pick, extra, then, fleet)
        if a is not None:
            actions.append(a)
    return actions


def _band(draw: float, bands: tuple[tuple[float, T], ...]) -> tuple[T, float]:
    """The band ``draw`` (in ``[0, 1)``) falls in, and where in it (in ``[0, 1)``)."""
    edge = 0.0
    for below, value in bands:
        if draw < below:
            return value, (draw - edge) / (below - edge)
        edge = below
    return bands[-1][1], 0.0


def _rotate(pick: float, extra: float, then: float, fleet: Fleet) -> Action | None:
    """A host rotation (CONTRACT.md §6.1): an active host that runs tasks (Postgres says so,
    or its agent holds them) and does not drain is drained with ``migrate`` and a deadline
    drawn from ``ROTATE_DEADLINES``; what follows is drawn from ``ROTATE_THEN``: ``rotate
    NAME DEADLINE [undrain AFTER | retire]`` (``chaos.actions.Runner`` carries out the
    follow-up)."""
    pool = [
        n
        for n in fleet.names("active")
        if (fleet.running.get(n, 0) or fleet.held[n]["tasks"]) and n not in fleet.draining
    ]
    name = _choose(pool, pick)
    if name is None:
        return Action("rotate-skipped")  # drawn, but no host runs tasks: said in the round
    (low, high), at = _band(extra, ROTATE_DEADLINES)
    deadline = round(low + at * (high - low), 1)
    follow, at = _band(then, ROTATE_THEN)
    if follow == "undrain":
        lo, hi = UNDRAIN_AFTER_S
        return Action("rotate", (name, deadline, "undrain", round(lo + at * (hi - lo), 1)))
    return Action("rotate", (name, deadline, *([follow] if follow else [])))


def _gone(action: Action, fleet: Fleet) -> None:
    """A host retired or dead in this round takes no further action in it: a later
    ``silence`` (or ``partition``) of it would wake its old boot when it ends, and a retired
    host comes back only as a new boot (CONTRACT.md §5.1; ``rejoin``). Seed 31 at 1.1,
    round 66: "retire w1; silence w1 13.5" woke the retired boot, whose beats reaper
    rightly ignored, and the settle check reported "w1 beats but is retired"."""
    if action.what in ("retire", "die"):
        name = str(action.args[0])
        fleet.modes[name] = "retired" if action.what == "retire" else "dead"
        fleet.gone.add(name)


def _choose(items: list[str], pick: float) -> str | None:
    return items[int(pick * len(items))] if items else None


def _agent_action(what: str, pick: float, extra: float, fleet: Fleet) -> Action | None:
    active = fleet.names("active")
    if what == "join":
        if len(fleet.modes) >= AGENTS_MAX:
            return None
        return Action("join", (f"w{len(fleet.modes)}",))
    if what == "partition":  # most of the fleet silent at once: full disruption (rule 6)
        n = len(active)
        if n < 4:
            return None
        quiet = max(1, round(0.6 * n))
        return Action("partition", (tuple(active[:quiet]), 2.0 + extra * (LOST_AFTER_S + 6)))
    if what in ("rejoin", "revive"):
        if what == "rejoin":
            pool = [n for n in fleet.names("retired") if n in fleet.retired_seen]
        else:
            pool = [n for n in fleet.names("dead") if n not in fleet.gone]
        name = _choose(pool, pick)
        return Action("rejoin", (name,)) if name else None
    name = _choose(active, pick)
    if name is None:
        return None
    held = fleet.held[name]
    if what in ("drop", "flap"):
        kind = KINDS[int(extra * len(KINDS))]
        handle = _choose(sorted(held[kind]), (extra * len(KINDS)) % 1)
        if handle is None:
            return None
        if what == "drop":
            return Action("drop", (name, kind, handle))
        return Action("flap", (name, kind, handle, 0.5 + extra * (MISSING_TTL_S - 2.0)))
    if what == "silence":
        # Short (< STALL_AFTER), a stall, or long enough to be lost and reaped.
        top = LOST_AFTER_S + 8
        return Action("silence", (name, 1.0 + extra * (top - 1.0)))
    if what in ("reboot", "wipe"):
        return Action("reboot", (name, what == "wipe"))
    if what == "stray":
        return Action("stray", (name, "containers", fleet.fresh(f"stray-{name}")))
    if what == "drain":
        return Action("drain", (name, True)) if name not in fleet.draining else None
    if what == "undrain":
        name = _choose(sorted(fleet.draining & set(active)), pick)
        return Action("drain", (name, False)) if name else None
    if what == "retire":
        return Action("retire", (name,)) if len(active) > 4 else None
    if what == "die":
        if len(fleet.names("dead")) >= MAX_DEAD or len(active) <= 4:
            return None
        return Action("die", (name,))
    raise AssertionError(what)


def _scheduler_action(what: str, pick: float, extra: float, fleet: Fleet) -> Action | None:
    if what == "service":
        # With rotations, a service's max_surge (1-3) comes from the draw a service does
        # not otherwise use, so the rounds draw as at 1.1.
        surge = (1 + int(pick * 3),) if fleet.rotations else ()
        return Action("service", (fleet.fresh("svc"), 1 + int(extra * 4), *surge))
    name = _choose(fleet.names("active"), pick)
    if name is None:
        return None
    kind = kinds.HANDLE_ROWS[int(extra * len(kinds.HANDLE_ROWS))].report
    handle = fleet.fresh(f"{kind[0]}-{name}")
    if what in ("handle", "two-phase"):
        return Action("handle", (name, kind, handle, what == "two-phase"))
    return Action("phantom", (name, kind, handle, what == "creating"))


def _fault(what: str, pick: float, extra: float, fleet: Fleet) -> Action | None:
    if what == "kill":
        alive = [str(i) for i, up in enumerate(fleet.replicas_alive) if up]
        if len(alive) < 1:
            return None
        i = int(_choose(alive, pick) or 0)
        return Action("kill", (i, 0.5 + extra * 6.0))
    if what == "kill-both":
        if not all(fleet.replicas_alive):
            return None
        return Action("kill-both", (1.0 + extra * 10.0,))
    outage = {"temporal", "postgres"} & fleet.busy
    if what == "temporal":
        down = 1.0 + extra * (LOST_AFTER_S + STALL_AFTER_S)
        return None if outage else Action("temporal", (down,))
    if what.startswith("postgres"):
        mode = "immediate" if what == "postgres-crash" else "fast"
        return None if outage else Action("postgres", (mode, 1.0 + extra * 8.0))
    if "postgres" in fleet.busy or "lock" in fleet.busy:
        return None
    if what == "lock":
        return Action("lock", (_choose(list(LOCKABLE), pick), 5.0 + extra * 20.0))
    if what == "sleep":
        return Action("sleep", (_choose(sorted(ROW_LOCKS), pick), 5.0 + extra * 20.0))
    return Action("terminate")
