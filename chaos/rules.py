"""The invariants as pure functions over values: what the checker concludes from the
campaign's log and its observations of Postgres (tested by tables in tests/chaos).

Each function answers one question conservatively: it reports a violation only when the
evidence rules out every legitimate explanation, given ``tol`` seconds of clock slack.
Times are Unix seconds; durations seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from chaos.ledger import Beat, Command, Window

V = TypeVar("V")


@dataclass(frozen=True)
class Violation:
    """One broken rule: which rule, about which row or worker, and the evidence."""

    rule: str
    subject: str
    evidence: str
    at: float

    def __str__(self) -> str:
        return f"VIOLATION [{self.rule}] {self.subject}: {self.evidence}"


@dataclass(frozen=True)
class Seen(Generic[V]):
    """One observation: ``value`` held at some instant in ``[before, after]``."""

    before: float
    after: float
    value: V


def unchanged_over(series: Sequence[Seen[V]], t0: float, t1: float) -> V | None:
    """The value that certainly held throughout ``[t0, t1]``, if the observations show one:
    one taken surely at or before ``t0``, one surely at or after ``t1``, and every one
    between them equal. Values carry their ``since`` timestamps, so a change and a change
    back in between differ and are not mistaken for no change."""
    first = next((i for i in range(len(series) - 1, -1, -1) if series[i].after <= t0), None)
    if first is None:
        return None
    value = series[first].value
    for s in series[first:]:
        if s.value != value:
            return None
        if s.before >= t1:
            return value
    return None


def too_early(
    at: float, ttl: float, tol: float, bounds: Iterable[tuple[str, float | None]]
) -> list[str]:
    """Rule 4: a handle is destroyed only after ``ttl`` of reported absence. Each bound names
    an instant the absence cannot have started before (the last report that held the handle,
    the row becoming ``created``, the worker's return, the mark itself); returns the
    evidence for each bound the destroy at ``at`` came less than ``ttl`` after."""
    return [
        f"{what} at {stamp(t)}, destroyed {at - t:.2f}s later (MISSING_TTL {ttl:g}s)"
        for what, t in bounds
        if t is not None and at < t + ttl - tol
    ]


def spans_return(
    at: float,
    returns: Iterable[float],
    ttl: float,
    stall_after: float,
    tol: float,
    bounds: Iterable[tuple[str, float | None]],
) -> list[str]:
    """Rule 4: time stalled does not count. A worker's return (``state_since`` of a
    ``running`` state: a beat after ``stall_after`` of silence, judged or not) clears its
    marks, and only reports taken after it decide. A destroy less than ``ttl`` after a
    return therefore rests on a report taken before the silence, which began by
    ``return - stall_after``: the absence must have begun ``ttl`` before that. Returns the
    evidence for each bound (see :func:`too_early`) that began later."""
    out = []
    for y in sorted(returns):
        if not y < at < y + ttl - tol:
            continue
        latest = y - stall_after - ttl
        out += [
            f"destroyed {at - y:.2f}s after the worker's return at {stamp(y)}, but {what} "
            f"at {stamp(t)}: its MISSING_TTL of absence spans the silence before the return"
            for what, t in bounds
            if t is not None and t > latest + tol
        ]
    return out


def last_holding(beats: Sequence[Beat], kind: str, handle: str, before: float) -> float | None:
    """When the agent began sending its last acknowledged report that held ``handle``,
    among reports begun before ``before``: its absence cannot have started earlier."""
    for b in reversed(beats):
        if b.sent <= before and b.acked is not None and handle in b.reports.get(kind, ()):
            return b.sent
    return None


@dataclass(frozen=True)
class Gap:
    """A silence that could justify a ``lost`` verdict: ``last`` may have been the last beat
    the controller had, and ``next`` (acknowledged) came at least ``LOST_AFTER`` later."""

    last: Beat
    next: Beat | None


def lost_gaps(beats: Sequence[Beat], judged_by: float, lost_after: float, tol: float) -> list[Gap]:
    """Rule 5 on the controller's clock: a worker judged ``lost`` by ``judged_by`` heard
    nothing for ``lost_after`` before the verdict. A beat the server acknowledged is in the
    liveness's history by its ``acked`` time and is applied before any later verdict, so a
    legitimate verdict needs a beat ``b`` (acknowledged or not: a failed call may have got
    through) sent by ``judged_by - lost_after`` after which no acknowledged beat came within
    ``lost_after``. Returns every such gap; none means the verdict broke the rule."""
    gaps = []
    for i, b in enumerate(beats):
        if b.sent > judged_by - lost_after + tol:
            break
        nxt = next((n for n in beats[i + 1 :] if n.acked is not None), None)
        if nxt is None or (nxt.acked is not None and nxt.acked >= b.sent + lost_after - tol):
            gaps.append(Gap(b, nxt))
    return gaps


def grace_covers(
    gap: Gap,
    temporal_down: Iterable[Window],
    silent: bool,
    stall_after: float,
    tol: float,
) -> Window | None:
    """The outage grace (docs/safety.md): a deadline judged more than a heartbeat late
    gives the worker ``STALL_AFTER`` from the controller's first look to beat again. A gap
    is covered when the agent kept beating through it (not ``silent``), a Temporal outage
    overlaps it, and the first acknowledged beat after the server was back came within
    ``stall_after`` of its return; such a gap cannot justify a ``lost`` verdict. Only the
    gap's first outage counts (``one-grace``): a second one before any beat got through may
    be looked at late again, and gets no grace of its own."""
    n = gap.next
    if silent or n is None or n.acked is None:
        return None
    downs = sorted(
        (w for w in temporal_down if w.end is not None and w.overlaps(gap.last.sent, n.sent)),
        key=lambda w: w.start,
    )
    for w in downs[:1]:
        assert w.end is not None
        if w.end <= n.acked <= w.end + stall_after - tol:
            return w
    return None


def fresh_period_broken(
    at: float, recoveries: Iterable[float], lost_after: float, tol: float
) -> float | None:
    """Rule 6: after the fleet leaves full disruption (``recovered_at``), every worker gets a
    fresh ``lost_after`` before an automatic reap. Returns the recovery a reap at ``at``
    came too soon after, if any."""
    earlier = [r for r in recoveries if r < at]
    if not earlier:
        return None
    r = max(earlier)
    return r if at < r + lost_after - tol else None


def above_count(
    desired: int, max_surge: int, active: int, migrating: int
) -> tuple[str, str] | None:
    """§5.1 and §6.1: a service's active (``pending`` + ``running``) tasks never exceed
    ``desired_count + max_surge``, and exceed ``desired_count`` only while a drain migrates
    its tasks: by no more than ``migrating``, its tasks running on workers whose migration
    runs (``migrate_until`` set; each has at most one replacement) read in the same
    statement. Returns the broken rule and the evidence, or ``None``."""
    if active > desired + max_surge:
        return (
            "§6.1: service above desired_count + max_surge",
            f"{active} active tasks, desired_count {desired}, max_surge {max_surge}",
        )
    if active > desired + min(max_surge, migrating):
        return (
            "§5.1: service above desired_count",
            f"{active} active tasks, desired_count {desired}; {migrating} of them running on"
            f" migrating workers (max_surge {max_surge})",
        )
    return None


def reported_by(beats: Iterable[Beat], task: str, at: float, tol: float) -> float | None:
    """§6.1: a replacement runs once its worker reports it (rule 5), so an original stopped
    (``drained``) at ``at`` needs a beat holding the replacement sent by then (acknowledged
    or not: a failed call may have got through). When the first such beat was sent, or
    ``None``."""
    sent = [b.sent for b in beats if b.sent <= at + tol and task in b.reports.get("tasks", ())]
    return min(sent, default=None)


def deadline_came(at: float, rotations: Iterable[Command], tol: float) -> bool:
    """§6.1: a task stopped at a drain's deadline (``drain-deadline``) at ``at`` needs a
    rotation (a ``drain`` with ``migrate``) whose deadline had come: the controller counts it
    from when it applies the drain, no sooner than the attempt was sent."""
    return any(c.deadline is not None and c.sent + c.deadline <= at + tol for c in rotations)


def sent_by(at: float, commands: Iterable[Command], tol: float) -> bool:
    """Whether one of ``commands`` was sent by ``at`` (an ``undrain`` before the replacements
    it stopped, §6.1)."""
    return any(c.sent <= at + tol for c in commands)


def repeated(items: Iterable[str]) -> dict[str, int]:
    """Items seen more than once, with their counts (a row destroyed twice)."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return {k: n for k, n in counts.items() if n > 1}


def stamp(t: float) -> str:
    """A Unix time as ``HH:MM:SS.mmm`` UTC, for evidence lines."""
    import time

    return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}"
