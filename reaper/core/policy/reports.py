"""Whether a worker's heartbeats still carry complete reports, or liveness only.

A heartbeat's list of a kind is either complete (CONTRACT.md §2: the handles held now) or
absent (``null``: liveness only, nothing marked or cleared). An agent that cannot read its
host (a container engine that is down) keeps beating with ``null`` lists, rightly: its
worker stays ``running`` and nothing is destroyed on its account. But nothing is noticed on
that host either: a task whose container died is not stopped and replaced, an assignment is
not started, an orphan is not removed. That must be visible to operators, so each worker's
row keeps when its beats last carried a complete report of each kind
(``workers.<kind>_complete_at``, written with ``last_heartbeat_at``), and this module
judges it, for the gauge ``reaper_workers_reports_incomplete``, ``reaper workers`` and
``reaper explain worker``.

The rule: a worker whose complete reports decide (``running``, ``states.DECIDING``) and
which has beaten reports liveness only for a kind when its last complete report of that
kind is more than ``RESYNC_INTERVAL`` older than its last heartbeat (or it never sent
one). ``RESYNC_INTERVAL`` is the contract's own bound on how stale a diff may be (§5.3); the
comparison is with the last heartbeat, not the clock, since both come from one write of the
row: a row that lags the liveness (by up to ``STALL_AFTER``, §5.3) or a worker that fell
silent (stalled: it does not beat at all) is not mistaken for one that beats without
reports.

Pure: times are UTC ``datetime``s, durations seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from reaper.core import states
from reaper.core.contract import KINDS


@dataclass(frozen=True)
class LivenessOnly:
    """A worker whose beats have carried no complete report of some kinds for longer than
    ``RESYNC_INTERVAL``.

    Attributes:
        kinds: those kinds, in the contract's order (``containers``, ``volumes``, ``tasks``).
        since: the oldest of their last complete reports (UTC); ``None`` when one of them
            never came.
    """

    kinds: tuple[str, ...]
    since: datetime | None


def liveness_only(
    state: str,
    last_heartbeat_at: datetime | None,
    complete_at: Mapping[str, datetime | None],
    resync_interval: float,
) -> LivenessOnly | None:
    """Whether (and since when) a worker's beats have been liveness only (see the module).

    Args:
        state: the worker's state (a ``WorkerState`` value); only a deciding one is judged.
        last_heartbeat_at: its last heartbeat as the same row holds it; ``None``: never beat.
        complete_at: kind -> its last complete report of that kind (``None``: none); a kind
            left out counts as ``None``.
        resync_interval: ``REAPER_RESYNC_INTERVAL``, seconds.

    Returns:
        ``None`` when its reports are complete enough, or it is not judged (not deciding,
        or never beat); else the kinds behind and since when.
    """
    if last_heartbeat_at is None or not states.worker(state).decides:
        return None
    behind = []
    for kind in KINDS:
        at = complete_at.get(kind)
        if at is None or (last_heartbeat_at - at).total_seconds() > resync_interval:
            behind.append(kind)
    if not behind:
        return None
    times = [complete_at.get(k) for k in behind]
    since = None if any(t is None for t in times) else min(t for t in times if t is not None)
    return LivenessOnly(tuple(behind), since)
