"""What must hold once the faults have ended and the fleet has been left alone: nothing that
was due is left undone (CONTRACT.md rule 8).

:func:`unmet` compares one consistent snapshot of Postgres with what each agent holds, and
lists every condition that does not hold yet; the campaign polls it until the list is empty
or ``SETTLE_BOUND_S`` has passed. What is still unmet then is a violation only if it is
due: the rules' time for it (``DUE_S``, ``STATE_DUE_S``, ``REAP_DUE_S``) has passed since
the quiet period began, since its own clock started and since the worker's latest return.
A worker the controller judged silent again meanwhile (a loaded machine) restarts that
clock, as rule 4 says: time stalled does not count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from chaos.agents import Agents
from chaos.ledger import Beat, Ledger
from chaos.rules import last_holding
from chaos.settings import (
    ATTEMPT_S,
    HEARTBEAT_S,
    LONGEST_WAIT_S,
    LOST_AFTER_S,
    RESYNC_S,
    STALL_AFTER_S,
)
from reaper.core import kinds

DUE_S = LONGEST_WAIT_S + RESYNC_S + 3 * HEARTBEAT_S + ATTEMPT_S
"""How long the rules give the controller, once a worker runs and nothing is down, for a
handle, task or orphan to be dealt with: an absent row is marked within ``RESYNC_INTERVAL +
2 x HEARTBEAT_INTERVAL`` (§5.3) and destroyed as long as its kind waits later
(``policy.collection.destroy_after``), on the report asked for then (one more beat); an
orphan is listed within ``MISSING_TTL + RESYNC_INTERVAL + 2 x HEARTBEAT_INTERVAL`` (§5.3);
plus one activity attempt (``start_to_close``)."""
STATE_DUE_S = 2 * HEARTBEAT_S + ATTEMPT_S
"""§5.3: ``state`` shows a change within ``2 x HEARTBEAT_INTERVAL``; plus one attempt."""
REAP_DUE_S = LOST_AFTER_S + STALL_AFTER_S + ATTEMPT_S
"""A silent worker is lost ``LOST_AFTER`` after its last beat (after at most one outage
grace of ``STALL_AFTER``) and reaped by one activity."""

SNAPSHOT = {
    "workers": (
        "SELECT name, state, extract(epoch FROM state_since)::float8 AS since FROM reaper.workers"
    ),
    "handles": " UNION ALL ".join(
        f"SELECT '{k.report}' AS kind, {k.key} AS handle, worker, state,"
        f" missing_since IS NOT NULL AS m FROM {k.table}"
        for k in kinds.HANDLE_ROWS
    ),
    "tasks": (
        "SELECT id, service, worker, state, missing_since IS NOT NULL AS m FROM reaper.tasks"
    ),
    "services": "SELECT name, desired_count FROM reaper.services",
    "fleet": "SELECT state FROM reaper.fleet WHERE id = 1",
}


async def snapshot(pool: asyncpg.Pool) -> dict[str, list[Any]]:
    """One ``REPEATABLE READ`` snapshot of the tables the conditions read."""
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
        return {name: await conn.fetch(sql) for name, sql in SNAPSHOT.items()}


@dataclass(frozen=True)
class Pending:
    """A condition that does not hold yet: ``what``, about ``worker``, and since when its
    clock runs (``since``; the quiet period's start when ``None``)."""

    what: str
    worker: str | None = None
    since: float | None = None
    due_s: float = DUE_S

    def due_from(self, quiet: float, returns: dict[str, float]) -> float:
        """When the rules' time for it began: the latest of the quiet period's start, its
        own clock, and the worker's latest return (``state_since`` of ``running``)."""
        ret = returns.get(self.worker, 0.0) if self.worker is not None else 0.0
        return max(quiet, self.since or 0.0, ret)


def beating_since(beats: list[Beat]) -> float | None:
    """When the agent's latest run of acknowledged beats, none ``STALL_AFTER`` apart, began."""
    acked = [b for b in beats if b.acked is not None]
    if not acked:
        return None
    i = len(acked) - 1
    while i > 0 and acked[i].sent - acked[i - 1].sent < STALL_AFTER_S:
        i -= 1
    return acked[i].sent


def unmet(snap: dict[str, list[Any]], agents: Agents, ledger: Ledger) -> list[Pending]:
    """Every condition of the settled fleet that does not hold in ``snap``."""
    out: list[Pending] = []
    state = {r["name"]: r["state"] for r in snap["workers"]}
    since = {r["name"]: r["since"] for r in snap["workers"]}
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for r in snap["handles"]:
        rows.setdefault(r["worker"], {}).setdefault(r["kind"], {})[r["handle"]] = r
    tasks: dict[str | None, dict[str, Any]] = {}
    for r in snap["tasks"]:
        tasks.setdefault(r["worker"], {})[r["id"]] = r
    if snap["fleet"] and snap["fleet"][0]["state"] == "full":
        out.append(Pending("the fleet is still in full disruption"))
    for name, a in sorted(agents.agents.items()):
        mine = rows.get(name, {})
        active = [t for t in tasks.get(name, {}).values() if t["state"] in ("pending", "running")]
        beats = ledger.beats.get(name, [])

        def absent(kind: str, h: str, beats: list[Beat] = beats) -> float | None:
            insert = ledger.inserts.get(h)
            held = last_holding(beats, kind, h, float("inf"))
            return max(held or 0.0, insert.created if insert else 0.0) or None

        if a.mode == "active":
            if state.get(name) != "running":
                what = f"{name} beats but is {state.get(name)}"
                out.append(Pending(what, None, beating_since(beats), STATE_DUE_S))
                continue
            for kind in (k.report for k in kinds.HANDLE_ROWS):
                known = mine.get(kind, {})
                for h, r in sorted(known.items()):
                    if r["state"] != "creating" and h not in a.held[kind]:
                        what = f"{kind} {h} of {name}: absent from its reports, not destroyed"
                        out.append(Pending(what, name, absent(kind, h)))
                    elif r["m"] and h in a.held[kind]:
                        what = f"{kind} {h} of {name}: reported, still marked missing"
                        out.append(Pending(what, name))
                for h in sorted(a.held[kind] - set(known)):
                    what = f"{kind} {h}: held by {name}, unknown, not yet an orphan"
                    out.append(Pending(what, name, a.held_at.get(h)))
            for t in active:
                if t["state"] == "pending":
                    out.append(Pending(f"task {t['id']} placed on {name}: still pending", name))
                elif t["id"] not in a.held["tasks"]:
                    what = f"task {t['id']} of {name}: absent from its reports, running"
                    out.append(Pending(what, name, absent("tasks", t["id"])))
                elif t["m"]:
                    what = f"task {t['id']} of {name}: reported, still marked missing"
                    out.append(Pending(what, name))
            placed = {t["id"] for t in active}
            for t in sorted(a.held["tasks"] - placed):
                what = f"task {t}: held by {name} but not placed there (an orphan)"
                out.append(Pending(what, name))
        elif a.mode == "dead" and state.get(name) not in ("lost", None):
            last = max((b.sent for b in beats if b.acked is not None), default=None)
            what = f"{name} is dead but {state.get(name)}"
            out.append(Pending(what, None, last, REAP_DUE_S))
        elif state.get(name) == "lost" and active:
            what = f"{name} is lost but {len(active)} of its tasks are not reaped"
            out.append(Pending(what, None, since.get(name), REAP_DUE_S))
        elif state.get(name) == "retired" and (active or any(mine.values())):
            out.append(Pending(f"{name} is retired but still has rows or active tasks"))
    desired = {r["name"]: r["desired_count"] for r in snap["services"]}
    count: dict[str, int] = {}
    for per_worker in tasks.values():
        for t in per_worker.values():
            if t["state"] in ("pending", "running") and t["service"] is not None:
                count[t["service"]] = count.get(t["service"], 0) + 1
    for name, d in sorted(desired.items()):
        if count.get(name, 0) != d:
            out.append(Pending(f"service {name}: {count.get(name, 0)} active tasks, desired {d}"))
    for t in sorted(tasks.get(None, {}).values(), key=lambda t: t["id"]):
        if t["state"] == "pending":
            out.append(Pending(f"task {t['id']}: owed, never placed"))
    return out


def returns(snap: dict[str, list[Any]]) -> dict[str, float]:
    """Per running worker, its latest return (``state_since``)."""
    return {r["name"]: r["since"] for r in snap["workers"] if r["state"] == "running"}
