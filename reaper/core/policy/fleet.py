"""Fleet policy: the disruption state (CONTRACT.md rule 6) and whether a worker may be reaped.

After Kubernetes' node lifecycle controller (zone states ``Normal``, ``PartialDisruption``,
``FullDisruption``). Pure functions; times are UTC ``datetime``s, durations seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

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




@dataclass(frozen=True)
class ReapVerdict:
    """Whether a worker may be reaped now; if not, why and when to ask again (UTC)."""

    allowed: bool
    refused: str | None = None
    retry_at: datetime | None = None


def may_reap(
    forced: bool,
    worker_state: str | None,
    fleet: FleetState | str,
    recovered_at: datetime | None,
    last_heartbeat_at: datetime | None,
    now: datetime,
    lost_after: float,
) -> ReapVerdict:
    """The central decision of "may this worker be reaped now?" (CONTRACT.md rules 5 and 6).

    A forced reap (operator) is refused only for an unknown worker. An automatic reap needs
    the worker ``lost``, the fleet not in full disruption (a partition looks like many
    workers lost at once: Kubernetes stops evicting in a fully disrupted zone), and, after
    the fleet recovered from full disruption, ``lost_after`` seconds since the recovery for
    a worker that has not beaten since (every worker gets a fresh ``LOST_AFTER``). The rate
    limit comes after this verdict (:func:`take_reap_token`).

    Args:
        forced: an operator's ``force_reap``.
        worker_state: the worker's recorded state, ``None`` if unknown.
        fleet: the fleet's disruption state.
        recovered_at: when the fleet last left full disruption (UTC), if ever.
        last_heartbeat_at: the worker's last beat (UTC), if any.
        now: the controller's clock (UTC).
        lost_after: ``REAPER_LOST_AFTER`` in seconds.
    """
    if worker_state is None:
        return ReapVerdict(False, "unknown worker")
    if forced:
        return ReapVerdict(True)
    if worker_state != "lost":
        return ReapVerdict(False, f"worker is {worker_state}, not lost")
    if FleetState(fleet) is FleetState.full:
        return ReapVerdict(False, "fleet in full disruption")
    if recovered_at is not None and (last_heartbeat_at is None or last_heartbeat_at < recovered_at):
        fresh_until = recovered_at + timedelta(seconds=lost_after)
        if now < fresh_until:
            return ReapVerdict(False, "fleet recovering: fresh LOST_AFTER", fresh_until)
    return ReapVerdict(True)


@dataclass(frozen=True)
class Bucket:
    """The fleet-wide reap token bucket: ``tokens`` left as of ``updated_at`` (UTC)."""

    tokens: float
    updated_at: datetime | None


def take_reap_token(
    bucket: Bucket | None, now: datetime, rate: float, burst: int
) -> tuple[Bucket | None, datetime | None]:
    """Take one token for an automatic reap (Kubernetes' node eviction rate limiter).

    A bucket of ``burst`` tokens (``REAPER_REAP_BURST``, default 10) refilled at ``rate``
    per second (``REAPER_REAP_RATE``, default 1). ``bucket`` ``None`` means never used: full.

    Returns:
        ``(new_bucket, None)`` when a token was taken, or ``(None, retry_at)`` when the
        bucket is empty: nothing changes and ``retry_at`` (UTC) is when a token is due.
    """
    tokens = float(burst) if bucket is None else bucket.tokens
    if bucket is not None and bucket.updated_at is not None:
        elapsed = max((now - bucket.updated_at).total_seconds(), 0.0)
        tokens = min(float(burst), tokens + elapsed * rate)
    if tokens < 1.0:
        return None, now + timedelta(seconds=(1.0 - tokens) / rate)
    return Bucket(tokens - 1.0, now), None
