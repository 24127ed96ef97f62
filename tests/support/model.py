"""A small reference model of reaper's liveness and report GC, for property tests.

Two layers, kept apart on purpose:

* **Contract** (CONTRACT.md §2 fencing and liveness, §4 rules 1-4): what a complete report
  from a ``running`` worker does to the rows (``reconcile``), when a worker is ``running``,
  ``stalled`` or ``lost`` (``state``), what a return does (marks restart), which beats are
  news (``Fence``). Written from the contract's words, not from reaper's code.
* **Scheduling** (reaper's design, not the contract): *which* complete reports get diffed.
  reaper diffs a report when it changed, when the worker has just returned, when the
  collector asked for one because a TTL fell due (a mark, or an unknown handle becoming an
  orphan), or when ``RESYNC`` seconds passed since the last diffed report of that kind (the
  harness runs no fleet monitor, so no change feed: its controller re-diffs every
  ``RESYNC_INTERVAL``); an unchanged report in between is dropped (it would
  change nothing except marking rows the scheduler added since, which the next resync does).
  The model reproduces that choice so it can predict exact end states.

``_audit`` re-checks every destroy the model performs against rule 4 read directly off the
list of accepted beats, so the model's own bookkeeping is checked as well. The model also
keeps what the ``state`` query shows (§2): ``missing`` (rows marked now) and ``orphans``
(handles reported but unknown for MISSING_TTL, as of each kind's last diffed report).

Times are seconds since the start of a timeline (floats). All durations default to the
test settings (tests/conftest.py ``make_settings``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

KINDS = ("containers", "volumes")
EVENT_KIND = {"containers": "container", "volumes": "volume"}
MARKABLE = ("created", "destroying")
RANK = {"running": 0, "stalled": 1, "lost": 2}


@dataclass(frozen=True)
class Timings:
    stall_after: float = 30.0
    lost_after: float = 300.0
    missing_ttl: float = 300.0
    disruption_threshold: float = 0.55
    resync: float = 25.0
    """RESYNC_INTERVAL (30 s) less half a heartbeat: reaper keeps the decision off the 10 s
    beat grid, so that a replay a few ms apart decides alike."""
    creating_timeout: float = 3600.0


# ---- contract: fencing (§2) ------------------------------------------------------------


@dataclass
class Fence:
    """§2: ``seq`` strictly increases within a boot; an older or equal ``seq`` of the current
    boot, or any beat of a boot seen before the current one, changes nothing. A boot id not
    seen before is a new boot (boot ids are opaque)."""

    boot: str | None = None
    seq: int = -1
    seen: list[str] = field(default_factory=list)

    def offer(self, boot: str, seq: int) -> bool:
        if boot == self.boot:
            if seq <= self.seq:
                return False
            self.seq = seq
            return True
        if boot in self.seen:
            return False
        self.seen.append(boot)
        self.boot, self.seq = boot, seq
        return True


# ---- contract: liveness (§1) -------------------------------------------------------------


def judge(silence: float, t: Timings = Timings()) -> str:
    """``running`` below STALL_AFTER of silence, ``lost`` from LOST_AFTER, else ``stalled``."""
    if silence >= t.lost_after:
        return "lost"
    if silence >= t.stall_after:
        return "stalled"
    return "running"


# ---- contract: rows and reconcile (§4 rules 1-4) -----------------------------------------


@dataclass
class Row:
    kind: str
    handle: str
    worker: str
    state: str  # creating, created, destroying
    changed_at: float
    missing_since: float | None = None
    markable_since: float | None = None  # when it first entered created/destroying

    def __post_init__(self) -> None:
        if self.state in MARKABLE and self.markable_since is None:
            self.markable_since = self.changed_at


@dataclass
class Beat:
    """An accepted beat, as the audit sees it."""

    at: float
    reports: dict[str, frozenset[str] | None]
    returned: bool


@dataclass
class WorkerModel:
    fence: Fence = field(default_factory=Fence)
    last_beat: float | None = None
    beats: list[Beat] = field(default_factory=list)
    # scheduling layer (reaper's design): per kind
    fwd: dict[str, frozenset[str]] = field(default_factory=dict)
    fwd_at: dict[str, float] = field(default_factory=dict)
    wanted: set[str] = field(default_factory=set)
    due: dict[str, float] = field(default_factory=dict)
    asked: set[str] = field(default_factory=set)
    # §2 orphans: reported handles unknown for this worker, since when (per kind)
    unknown: dict[str, dict[str, float]] = field(default_factory=dict)
    orphans: dict[str, list[str]] = field(default_factory=dict)


class Model:
    """The whole world of one timeline: workers, rows, ``destroyed`` events, the clock."""

    def __init__(self, timings: Timings = Timings()) -> None:
        self.t = timings
        self.now = 0.0
        self.workers: dict[str, WorkerModel] = {}
        self.rows: dict[tuple[str, str], Row] = {}
        self.events: list[tuple[str, str, str, str]] = []  # (kind, handle, worker, reason)
        self.audit_log: list[str] = []
        self.refused = 0  # destroys held back by full disruption (rule 6)

    # ---- the world changes -------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def worker(self, name: str) -> WorkerModel:
        return self.workers.setdefault(name, WorkerModel())

    def state(self, name: str) -> str | None:
        """The worker's liveness state now (``None`` if it never sent an accepted beat)."""
        w = self.workers.get(name)
        if w is None or w.last_beat is None:
            return None
        return judge(self.now - w.last_beat, self.t)

    def insert(self, kind: str, handle: str, worker: str, state: str, lag: float = 0.0) -> bool:
        """The scheduler inserts a row (no-op if the handle exists). ``lag``: its state
        change is stamped that much after now (it commits after a report now is taken)."""
        if (kind, handle) in self.rows:
            return False
        self.rows[(kind, handle)] = Row(kind, handle, worker, state, self.now + lag)
        return True

    def promote(self, kind: str, handle: str, lag: float = 0.0) -> str | None:
        """The scheduler moves a row on: ``creating`` -> ``created`` -> ``destroying``."""
        row = self.rows.get((kind, handle))
        if row is None or row.state == "destroying":
            return None
        row.state = {"creating": "created", "created": "destroying"}[row.state]
        row.changed_at = self.now + lag
        if row.markable_since is None:
            row.markable_since = row.changed_at
        return row.state

    def fleet_full(self) -> bool:
        """Rule 6: the fraction of stalled or lost workers is at or above the threshold."""
        states = [self.state(n) for n in self.workers]
        known = [x for x in states if x is not None]
        unhealthy = sum(x != "running" for x in known)
        return bool(known) and unhealthy / len(known) >= self.t.disruption_threshold

    def beat(
        self, name: str, boot: str, seq: int, reports: dict[str, Iterable[str] | None]
    ) -> bool:
        """A heartbeat arrives now. Returns whether it was accepted (§2 fencing)."""
        w = self.worker(name)
        if not w.fence.offer(boot, seq):
            return False  # "changes nothing"
        self._fire_timers(w)
        returned = w.last_beat is not None and self.state(name) != "running"
        if returned:
            # Rule 4: time spent stalled or lost does not count; the TTL restarts from
            # reported absence after the return. (Rule 1: nothing is marked while away.)
            for row in self._rows_of(name):
                row.missing_since = None
        w.last_beat = self.now
        normalized = {k: (None if reports.get(k) is None else frozenset(reports[k])) for k in KINDS}
        w.beats.append(Beat(self.now, normalized, returned))
        for kind in KINDS:
            handles = normalized[kind]
            if handles is not None and self._diffed(w, kind, handles, returned):
                self.reconcile(name, kind, handles)
        return True

    def reconcile(self, name: str, kind: str, handles: frozenset[str]) -> None:
        """A complete report of ``kind`` from the running worker ``name``, taken now."""
        now, ttl = self.now, self.t.missing_ttl
        rows = [r for r in self._rows_of(name) if r.kind == kind]
        for r in rows:
            if r.handle in handles:
                r.missing_since = None  # rules 1, 3: reappeared
            elif (
                r.state in MARKABLE
                and r.changed_at <= now  # rule 2
                and r.missing_since is None
            ):  # rule 3: only when it changes
                r.missing_since = now
        for r in rows:  # CREATING_TIMEOUT (§1): a row stuck in creating is collected
            if (
                r.state == "creating"
                and r.changed_at <= now - self.t.creating_timeout
                and not self.fleet_full()
            ):
                self._delete(r, "creating-timeout")
        # §2 orphans: reported, unknown to the controller (for this worker) for MISSING_TTL
        w = self.workers[name]
        known = {r.handle for r in self._rows_of(name) if r.kind == kind}
        seen = w.unknown.setdefault(kind, {})
        unknown = handles - known
        for h in list(seen):
            if h not in unknown:
                del seen[h]
        for h in unknown:
            seen.setdefault(h, now)
        w.orphans[kind] = sorted(h for h, first in seen.items() if now - first >= ttl)
        # Scheduling: the collector asks for a fresh report when the next unknown handle
        # becomes an orphan, as it does when a mark falls due.
        pending = [first + ttl for first in seen.values() if now - first < ttl]
        orphan_due = min(pending) if pending else None
        marked = [
            r for r in rows if r.missing_since is not None and (r.kind, r.handle) in self.rows
        ]
        w.asked.discard(kind)
        if marked and now - min(r.missing_since for r in marked) >= ttl and self.fleet_full():
            # Rule 6: nothing destroyed in full disruption. (Scheduling: reaper looks again
            # on the first report STALL_AFTER from now.)
            later = max(min(r.missing_since for r in marked) + ttl, now + self.t.stall_after)
            w.due[kind] = later if orphan_due is None else min(later, orphan_due)
            self.refused += 1
            return
        for r in marked:  # rule 4
            if now - r.missing_since >= ttl:
                self._audit(name, r, now)
                self._delete(r, "missing")
        left = [r.missing_since + ttl for r in marked if (r.kind, r.handle) in self.rows]
        if orphan_due is not None:
            left.append(orphan_due)
        if left:
            w.due[kind] = min(left)
        else:
            w.due.pop(kind, None)

    # ---- views -------------------------------------------------------------------------

    def row_view(self, workers: Iterable[str]) -> dict[tuple[str, str], tuple[str, str]]:
        names = set(workers)
        return {k: (r.worker, r.state) for k, r in self.rows.items() if r.worker in names}

    def marked(self) -> set[tuple[str, str]]:
        return {k for k, r in self.rows.items() if r.missing_since is not None}

    def missing(self, name: str) -> int:
        """§2 query ``state`` ``missing``: handles of the worker currently marked missing."""
        return sum(1 for r in self._rows_of(name) if r.missing_since is not None)

    def orphans(self, name: str) -> dict[str, list[str]]:
        """§2 query ``state`` ``orphans`` by kind, as of the last diffed report of each."""
        return {k: v for k, v in self.workers[name].orphans.items() if v}

    def destroyed(self) -> list[tuple[str, str, str]]:
        return sorted((EVENT_KIND[k], h, w) for k, h, w, _ in self.events)

    # ---- scheduling layer (reaper's design) ----------------------------------------------

    def _fire_timers(self, w: WorkerModel) -> None:
        """The collector's TTL timer fell due: it asks the liveness for a fresh report."""
        for kind, due in w.due.items():
            if due <= self.now and kind not in w.asked:
                w.asked.add(kind)
                w.wanted.add(kind)

    def _diffed(self, w: WorkerModel, kind: str, handles: frozenset[str], returned: bool) -> bool:
        forward = (
            kind not in w.fwd
            or w.fwd[kind] != handles
            or kind in w.wanted
            or returned
            or self.now - w.fwd_at[kind] >= self.t.resync
        )
        if forward:
            w.fwd[kind], w.fwd_at[kind] = handles, self.now
            w.wanted.discard(kind)
        return forward

    # ---- helpers -----------------------------------------------------------------------

    def _rows_of(self, name: str) -> list[Row]:
        return [r for r in self.rows.values() if r.worker == name]

    def _delete(self, r: Row, reason: str) -> None:
        del self.rows[(r.kind, r.handle)]
        self.events.append((r.kind, r.handle, r.worker, reason))

    def _audit(self, name: str, r: Row, now: float) -> None:
        """Rule 4 read off the beats: the worker is running, and since the later of its last
        return and the row becoming markable, every complete report of the kind lacked the
        handle after the last that held it, the first of them at least MISSING_TTL ago."""
        w = self.workers[name]
        state = self.state(name)
        assert state == "running", f"destroy of {r.handle} on a {state} worker"
        assert not self.fleet_full(), f"destroy of {r.handle} in full disruption"
        assert r.markable_since is not None
        back = r.markable_since
        previous = None
        for b in w.beats:  # returns, read off the gaps between accepted beats
            if previous is None or b.at - previous >= self.t.stall_after:
                back = max(back, b.at)
            previous = b.at
        reports = [b for b in w.beats if b.at >= back and b.reports[r.kind] is not None]
        # beats in arrival order (two may share a model time): those after the last holder
        held = [i for i, b in enumerate(reports) if r.handle in b.reports[r.kind]]
        lacking = [b.at for b in reports[held[-1] + 1 if held else 0 :]]
        assert lacking and lacking[-1] == now, f"destroy of {r.handle} not on a fresh report"
        first_lacking = lacking[0]
        assert now - first_lacking >= self.t.missing_ttl, (
            f"destroy of {r.handle} at {now}: absent only since {first_lacking}"
        )
        self.audit_log.append(f"{r.handle}@{now}: absent since {first_lacking}")


# ---- model-level reconcile of a batch, for coalesce() properties --------------------------


def reconcile_marks(
    marks: dict[str, float | None], report: Iterable[str], at: float, also_seen: Iterable[str] = ()
) -> dict[str, float | None]:
    """What reconcile_report does to ``missing_since`` of markable rows (rules 1-3), with
    ``also_seen`` (handles of superseded reports): seen after their mark, so it restarts."""
    held = set(report)
    seen = set(also_seen)
    out: dict[str, float | None] = {}
    for h, since in marks.items():
        if h in held:
            out[h] = None
        elif (since is not None and h in seen and since < at) or since is None:
            out[h] = at
        else:
            out[h] = since
    return out
