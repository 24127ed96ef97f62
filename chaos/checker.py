"""The invariants applied to the ledger and the observations: each ``events`` row of a destroy,
a reap or a state change judged against what the agents reported and when, plus the
services and rows read at every step. Violations are kept by key, so re-checking an event
once more is known changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from chaos import rules
from chaos.ledger import Ledger
from chaos.observe import Event, Observations
from chaos.rotation_checks import MIGRATION, migration_stop
from chaos.rules import Violation, stamp
from chaos.settings import (
    CLOCK_TOL_S,
    LOST_AFTER_S,
    MISSING_TTL_S,
    OBSERVE_EVERY_S,
    OWED_BOUND_S,
    QUIET_BEFORE_S,
    STALL_AFTER_S,
)
from reaper.core import kinds
from reaper.core.policy import migration
from reaper.core.policy.collection import destroy_after

KIND = {k.word: k.report for k in kinds.ALL}
"""``events.kind`` -> report kind (``reaper.core.kinds``)."""
TOL = CLOCK_TOL_S


class Checker:
    """Collects violations as the campaign goes; ``say`` prints each once."""

    def __init__(self, ledger: Ledger, obs: Observations, say: Callable[[str], None]) -> None:
        self.ledger, self.obs, self.say = ledger, obs, say
        self.violations: dict[tuple[str, str, int], Violation] = {}
        self.checked: set[int] = set()
        self.short_since: dict[str, float] = {}
        self.capacity_since: float | None = None

    def add(self, v: Violation) -> None:
        key = (v.rule, v.subject, round(v.at))
        if key not in self.violations:
            self.violations[key] = v
            self.say(str(v))

    def step(self) -> None:
        """Check what the latest reads brought: new events, rows, services."""
        for e in list(self.obs.events.values()):
            if e.id not in self.checked:
                self.checked.add(e.id)
                self.event(e)
        self.once()
        self.rows()
        self.services(time.time())

    def final(self) -> None:
        """Check every event again with everything observed since."""
        for e in self.obs.events.values():
            self.event(e)
        self.once()
        self.rows()

    # ---- events ------------------------------------------------------------------------

    def event(self, e: Event) -> None:
        if e.action in ("destroyed", "stopped"):
            self.destroy(e)
        elif e.action == "lost":
            self.reap(e)
        elif e.action == "state":
            self.state(e)

    def destroy(self, e: Event) -> None:
        what = f"{e.kind} {e.handle} of {e.worker}"
        if e.reason.startswith("retired"):
            self.retired_by_signal(e, what)
            return
        if e.kind == "task" and e.action == "stopped" and e.reason.startswith(MIGRATION):
            for v in migration_stop(e, what, self.obs, self.ledger):
                self.add(v)
            if e.reason.split(":")[0] == migration.DEADLINE:
                self.full(e, what, "stopped at a drain's deadline")
            return
        if e.reason != "missing":
            self.add(Violation("unexpected destroy", what, f"reason {e.reason!r}", e.at))
            return
        kind, handle, w = KIND[e.kind], e.handle or "", e.worker or ""
        insert = self.ledger.inserts.get(handle)
        bounds = [
            ("its agent began its last report holding it", self._held(w, kind, handle, e.at)),
            ("its row became created", insert.created if insert else None),
            ("its mark (missing_since seen)", self.obs.marks.get((kind, handle))),
        ]
        waits = destroy_after(kind, MISSING_TTL_S)
        for evidence in rules.too_early(e.at, waits, TOL, bounds):
            self.add(Violation("rule 4: destroyed before MISSING_TTL", what, evidence, e.at))
        returns = self.obs.returns.get(w, set())
        for evidence in rules.spans_return(e.at, returns, waits, STALL_AFTER_S, TOL, bounds):
            self.add(Violation("rule 4: stalled time counted", what, evidence, e.at))
        seen_by = self.obs.first_seen.get(e.id, e.at)
        state = rules.unchanged_over(self.obs.workers.get(w, []), e.at, seen_by)
        if state is not None and state[0] != "running":
            self.add(
                Violation(
                    "rule 4: destroyed while the worker was not running",
                    what,
                    f"destroyed at {stamp(e.at)}; the worker was {state[0]} since "
                    f"{stamp(state[1])} throughout",
                    e.at,
                )
            )
        self.full(e, what, "destroyed")

    def _held(self, worker: str, kind: str, handle: str, before: float) -> float | None:
        return rules.last_holding(self.ledger.beats.get(worker, []), kind, handle, before)

    def reap(self, e: Event) -> None:
        what = f"task {e.handle} of {e.worker}"
        if e.reason.startswith("retired"):
            self.retired_by_signal(e, what)
        elif e.reason.startswith("no heartbeat"):
            self.lost_verdict(e.worker or "", e.at, f"{what} reaped")
            self.full(e, what, "reaped")
            r = rules.fresh_period_broken(e.at, self.obs.recoveries, LOST_AFTER_S, TOL)
            if r is not None:
                self.add(
                    Violation(
                        "rule 6: reaped within a fresh LOST_AFTER",
                        what,
                        f"reaped at {stamp(e.at)}, {e.at - r:.2f}s after the fleet left full "
                        f"disruption at {stamp(r)} (LOST_AFTER {LOST_AFTER_S:g}s)",
                        e.at,
                    )
                )
        elif e.reason.startswith("stray"):
            self.full(e, what, "reaped as a stray")
        else:
            self.add(Violation("unexpected reap", what, f"reason {e.reason!r}", e.at))

    def state(self, e: Event) -> None:
        w = e.worker or ""
        if "-> lost" in e.reason and "no heartbeat" in e.reason:
            self.lost_verdict(w, e.at, "judged lost")
        if "-> retired" in e.reason:
            self.retired_by_signal(e, f"worker {w}")

    def lost_verdict(self, worker: str, judged_by: float, what: str) -> None:
        """Rule 5 and the outage grace, for a verdict taken by ``judged_by``."""
        beats = self.ledger.beats.get(worker, [])
        gaps = rules.lost_gaps(beats, judged_by, LOST_AFTER_S, TOL)
        if not gaps:
            acked = [b.acked for b in beats if b.acked is not None and b.acked <= judged_by]
            last = f"{judged_by - max(acked):.2f}s" if acked else "never"
            self.add(
                Violation(
                    "rule 5: lost though it beat within LOST_AFTER",
                    f"worker {worker}",
                    f"{what} at {stamp(judged_by)}; its agent's acknowledged beats leave no "
                    f"{LOST_AFTER_S:g}s silence before that (last acknowledged {last} before)",
                    judged_by,
                )
            )
            return
        downs = self.ledger.outages("temporal-down")
        covered = []
        for g in gaps:
            until = g.next.sent if g.next is not None else judged_by
            silent = self.ledger.silent_between(worker, g.last.sent, until)
            w = rules.grace_covers(g, downs, silent, STALL_AFTER_S, TOL)
            if w is None:
                return
            covered.append((g, w))
        g, w = covered[-1]
        assert g.next is not None and g.next.acked is not None and w.end is not None
        self.add(
            Violation(
                "outage grace: lost though it beat again within STALL_AFTER of recovery",
                f"worker {worker}",
                f"{what} at {stamp(judged_by)}; Temporal was down {stamp(w.start)}-"
                f"{stamp(w.end)}, the agent beat throughout and was acknowledged again "
                f"{g.next.acked - w.end:.2f}s after (STALL_AFTER {STALL_AFTER_S:g}s)",
                judged_by,
            )
        )

    def full(self, e: Event, what: str, verb: str) -> None:
        """Rule 6: nothing reaped or destroyed automatically in full disruption."""
        seen_by = self.obs.first_seen.get(e.id, e.at)
        fleet = rules.unchanged_over(self.obs.fleet, e.at, seen_by)
        if fleet is not None and fleet[0] == "full":
            self.add(
                Violation(
                    "rule 6: acted in full disruption",
                    what,
                    f"{verb} at {stamp(e.at)}; the fleet was in full disruption since "
                    f"{stamp(fleet[1])} throughout",
                    e.at,
                )
            )

    def retired_by_signal(self, e: Event, what: str) -> None:
        """§5.1: only a ``retire`` retires (automatic retirement is 24 h away here)."""
        sent = [t for t in self.ledger.retires.get(e.worker or "", []) if t <= e.at + TOL]
        if not sent:
            self.add(Violation("§5.1: retired without a retire", what, e.reason, e.at))

    # ---- across events and rows --------------------------------------------------------

    def once(self) -> None:
        """One row per action: nothing destroyed, taken down or replaced twice."""
        evs = sorted(self.obs.events.values(), key=lambda e: e.id)
        groups = {
            "destroyed twice": [
                f"{e.kind} {e.handle}" for e in evs if e.action in ("destroyed", "stopped")
            ],
            "task taken down twice": [
                f"task {e.handle}" for e in evs if e.action in ("lost", "stopped")
            ],
            "replacement recorded twice": [
                f"task {e.handle}" for e in evs if e.action == "replaced"
            ],
        }
        for rule, items in groups.items():
            for subject, n in rules.repeated(items).items():
                self.add(Violation(f"rule 8: {rule}", subject, f"{n} events rows", 0.0))
        last: dict[str, Event] = {}
        for e in evs:
            if e.action != "state" or e.worker is None:
                continue
            change = e.reason.split(":")[0]
            prev = last.get(e.worker)
            if prev is not None and prev.reason.split(":")[0] == change:
                self.add(
                    Violation(
                        "rule 8: state change recorded twice",
                        f"worker {e.worker}",
                        f"{change!r} at {stamp(prev.at)} and again at {stamp(e.at)}",
                        e.at,
                    )
                )
            last[e.worker] = e

    def rows(self) -> None:
        """Rule 2: no ``creating`` row marked; rule 7: no reaped task running again."""
        for kind, handle, at in self.obs.marked_creating:
            self.add(Violation("rule 2: creating row marked", f"{kind} {handle}", "", at))
        for task, states in self.obs.task_history.items():
            for i, s in enumerate(states):
                if s in ("lost", "stopped") and any(
                    t in ("pending", "running") for t in states[i + 1 :]
                ):
                    self.add(
                        Violation(
                            "rule 7: reaped task back", f"task {task}", " -> ".join(states), 0.0
                        )
                    )

    def services(self, now: float) -> None:
        """§5.1: never above ``desired_count``; not below it (nor work owed) for longer than
        the bound while a placeable worker exists and no fault disturbs the controller."""
        obs = self.obs
        for name, (desired, surge, active, migrating) in obs.services.items():
            broken = rules.above_count(desired, surge, active, migrating)
            if broken is not None:
                self.add(Violation(broken[0], f"service {name}", broken[1], obs.services_at))
        capacity = any(
            seen[-1].value[0] == "running" and not obs.draining.get(w, False)
            for w, seen in obs.workers.items()
            if seen
        )
        if not capacity:
            self.capacity_since = None
        elif self.capacity_since is None:
            self.capacity_since = now
        short = {n for n, (d, _, a, _) in obs.services.items() if a < d}
        short |= {
            f"owed task {t}" for t, (_, w, s) in obs.tasks.items() if s == "pending" and w is None
        }
        self.short_since = {n: self.short_since.get(n, now) for n in short}
        if self.capacity_since is None or self.ledger.faults_active():
            return
        calm = max(self.capacity_since, self.ledger.last_fault_end() + QUIET_BEFORE_S)
        for name, since in self.short_since.items():
            start = max(since, calm)
            if now - start > OWED_BOUND_S + OBSERVE_EVERY_S + TOL:
                self.add(
                    Violation(
                        "§5.1: short of desired_count with capacity",
                        name,
                        f"since {stamp(since)}; placeable workers and no fault for "
                        f"{now - start:.1f}s (bound {OWED_BOUND_S:g}s)",
                        since,
                    )
                )
