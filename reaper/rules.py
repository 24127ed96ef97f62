"""The pure rules of liveness and garbage collection: values in, decisions out, no I/O.

Workflows and activities both call these, and tests drive them with tables of cases
(STYLE.md: policy apart from mechanism, as Kubernetes' node lifecycle controller does).
All times are timezone-aware UTC ``datetime``s; all durations are seconds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Iterable, Mapping

from reaper.models import WorkerState

MAX_REMEMBERED_BOOT_IDS = 16
"""How many earlier boot ids a liveness remembers to refuse late beats from an old boot."""


class Fence(str, Enum):
    """Verdict on a heartbeat's ``(boot_id, seq)`` against what the liveness has seen."""

    accept = "accept"
    new_boot = "new-boot"
    stale_seq = "stale-seq"
    old_boot = "old-boot"

    @property
    def accepted(self) -> bool:
        return self in (Fence.accept, Fence.new_boot)


def fence(
    current_boot_id: str | None,
    last_seq: int,
    previous_boot_ids: Iterable[str],
    boot_id: str,
    seq: int,
) -> Fence:
    """Decide whether a heartbeat is news (CONTRACT.md section 2, ``seq`` and ``boot_id``).

    ``seq`` is strictly increasing within one boot id; a beat with an older or equal ``seq``
    for the current boot, or from a boot id seen before the current one, changes nothing.
    Any boot id never seen before is a new boot (boot ids are opaque, so "newer" can only
    mean "not seen before"). ``sent_at`` and arrival order play no part.

    Args:
        current_boot_id: the boot id of the last accepted beat, ``None`` if none yet.
        last_seq: ``seq`` of the last accepted beat (-1 if none).
        previous_boot_ids: boot ids accepted before the current one.
        boot_id, seq: the arriving beat's.
    """
    if boot_id == current_boot_id:
        return Fence.accept if seq > last_seq else Fence.stale_seq
    if boot_id in set(previous_boot_ids):
        return Fence.old_boot
    return Fence.new_boot


def remember_boot(previous: list[str], old_boot_id: str | None) -> list[str]:
    """The list of earlier boot ids after a new boot replaced ``old_boot_id`` (bounded)."""
    if old_boot_id is None:
        return previous
    return ([*previous, old_boot_id])[-MAX_REMEMBERED_BOOT_IDS:]


def judge_liveness(
    last_heartbeat_at: datetime, now: datetime, stall_after: float, lost_after: float
) -> WorkerState:
    """The state a worker is in by the controller's clock alone.

    ``running`` until ``stall_after`` seconds without a heartbeat, ``stalled`` until
    ``lost_after``, then ``lost`` (CONTRACT.md section 1; Kubernetes: Ready, Unknown, evicted).
    """
    silent = (now - last_heartbeat_at).total_seconds()
    if silent >= lost_after:
        return WorkerState.lost
    if silent >= stall_after:
        return WorkerState.stalled
    return WorkerState.running


def next_deadline(
    last_heartbeat_at: datetime,
    state: WorkerState,
    stall_after: float,
    lost_after: float,
    grace_until: datetime | None = None,
) -> datetime | None:
    """When the liveness must next look at the clock, or ``None`` if it need not.

    ``running``: when it would stall; ``stalled``: when it would be lost, but never before
    ``grace_until`` (an outage or a fleet recovery grants every worker a fresh period);
    ``lost``: no deadline (only a heartbeat changes anything).
    """
    if state is WorkerState.running:
        return last_heartbeat_at + timedelta(seconds=stall_after)
    if state is WorkerState.stalled:
        due = last_heartbeat_at + timedelta(seconds=lost_after)
        if grace_until is not None and grace_until > due:
            return grace_until
        return due
    return None


def outage_grace(
    deadline: datetime, now: datetime, heartbeat_interval: float, stall_after: float
) -> datetime | None:
    """A grace end if a deadline timer fired so late that the controller was not watching.

    A timer that fires more than one heartbeat interval after its deadline means the
    controller (or Temporal) was down: the worker's silence is then no evidence, since its
    beats may have been refused. The worker gets ``stall_after`` seconds from now to beat
    again before it can be reaped (issue 3, rule 4). Returns ``None`` when on time.
    """
    if (now - deadline).total_seconds() > heartbeat_interval:
        return now + timedelta(seconds=stall_after)
    return None


class FleetState(str, Enum):
    """Fleet disruption states, after Kubernetes' zone states (nodelifecycle controller)."""

    normal = "normal"
    partial = "partial"
    full = "full"


def fleet_state(healthy: int, unhealthy: int, threshold: float) -> FleetState:
    """The fleet's disruption state from counts of workers (CONTRACT.md rule 6).

    ``full`` when the fraction of unhealthy (stalled or lost) workers is at or above
    ``threshold`` (default 0.55, Kubernetes' ``--unhealthy-zone-threshold``): nothing is
    reaped or destroyed automatically. ``partial`` when some are unhealthy, below it;
    ``normal`` when none are. An empty fleet is ``normal``.
    """
    total = healthy + unhealthy
    if total == 0 or unhealthy == 0:
        return FleetState.normal
    if unhealthy / total >= threshold:
        return FleetState.full
    return FleetState.partial


def report_digest(handles: Iterable[str]) -> str:
    """A stable digest of a complete report: equal for the same set of handles in any order."""
    h = hashlib.sha256()
    for handle in sorted(set(handles)):
        h.update(handle.encode())
        h.update(b"\0")
    return h.hexdigest()


def place(candidates: Mapping[str, int], count: int) -> list[str]:
    """Pick workers for ``count`` new tasks, each on the one with the fewest running tasks.

    Args:
        candidates: healthy, non-draining worker name -> running (and pending) task count.
        count: number of tasks to place.

    Returns:
        One worker name per task placed (fewer than ``count`` if there are no candidates);
        ties go to the lexically smallest name so placement is deterministic.
    """
    load = dict(candidates)
    chosen: list[str] = []
    for _ in range(count):
        if not load:
            break
        name = min(load, key=lambda w: (load[w], w))
        chosen.append(name)
        load[name] += 1
    return chosen


@dataclass(frozen=True)
class ForwardDecision:
    """Whether a liveness hands a complete report to its collector, and why."""

    forward: bool
    reason: str


def should_forward(
    digest: str,
    forwarded_digest: str | None,
    taken_at: datetime,
    forwarded_at: datetime | None,
    resync_interval: float,
    wanted: bool,
) -> ForwardDecision:
    """Decide whether a complete report needs reconciling against Postgres.

    A changed report always does; an unchanged one only when the collector asked for a
    fresh report (a TTL fell due: destroy only on a report received after it) or when
    ``resync_interval`` seconds passed since the last one (rows the scheduler added since
    must be diffed too). Otherwise an unchanged report costs no database round trip.
    """
    if forwarded_digest is None or digest != forwarded_digest:
        return ForwardDecision(True, "changed")
    if wanted:
        return ForwardDecision(True, "due")
    if forwarded_at is None or (taken_at - forwarded_at).total_seconds() >= resync_interval:
        return ForwardDecision(True, "resync")
    return ForwardDecision(False, "unchanged")


def coalesce(older_handles: list[str], older_also_seen: list[str], newer: list[str]) -> list[str]:
    # (callers handle staged reports, whose handles are not at hand, with ``restart_all``)
    """The ``also_seen`` of a report that supersedes an unreconciled older one.

    Reports are complete lists, so only the latest needs diffing, except that a handle the
    older report held and the newer lacks was still seen after its mark: rule 4 wants every
    complete report since ``missing_since`` to lack a handle before it is destroyed, so its
    clock must restart. Returns the handles seen in the older report(s) but not in
    ``newer``, sorted.
    """
    keep = set(newer)
    return sorted({*older_handles, *older_also_seen} - keep)


def payload_bytes(handles: list[str]) -> int:
    """Approximate JSON size of a list of handles, in bytes (quotes and commas included)."""
    return sum(len(h.encode()) + 3 for h in handles) + 2


def chunk_handles(handles: list[str], max_bytes: int) -> list[list[str]]:
    """Split a complete report into chunks of at most ``max_bytes`` JSON bytes each (at least
    one chunk, possibly empty, so that an empty report is still a report)."""
    chunks: list[list[str]] = [[]]
    size = 2
    for h in handles:
        n = len(h.encode()) + 3
        if chunks[-1] and size + n > max_bytes:
            chunks.append([])
            size = 2
        chunks[-1].append(h)
        size += n
    return chunks
