"""Fleet policy: the disruption state (CONTRACT.md rule 6) and whether a worker may be reaped.

After Kubernetes' node lifecycle controller (zone states ``Normal``, ``PartialDisruption``,
``FullDisruption``). Pure functions; times are UTC ``datetime``s, durations seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from reaper.core import states


class FleetState(str, Enum):
    """How disrupted the fleet is (CONTRACT.md rule 6), judged on the whole fleet at once.

    The idea is Kubernetes' node lifecycle controller's (stop evicting when a large share
    of nodes goes unhealthy at once: the control plane, not the nodes, is then likely at
    fault), but the words mean reaper's things: there is one fleet, not a zone per failure
    domain; "unhealthy" counts ``stalled`` and ``lost`` workers (Kubernetes counts
    NotReady and Unknown nodes); and what full disruption holds back is reaping and every
    automatic destroy or stop (Kubernetes holds evictions, and in a partial disruption
    slows them, which reaper does by its reap rate in every state).
    """

    normal = "normal"
    """No worker is stalled or lost."""
    partial = "partial"
    """Some are, fewer than ``REAPER_DISRUPTION_THRESHOLD`` of the fleet: reaps go on."""
    full = "full"
    """At least that share is: nothing is reaped, destroyed or stopped automatically until
    it falls below, and then every worker gets a fresh ``LOST_AFTER``."""


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

    A worker in a state that is never reaped (``states.NEVER_REAPED``) is refused, forced
    or not; otherwise a forced reap (operator) is refused only for an unknown worker. An
    automatic reap needs
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
    if worker_state in states.NEVER_REAPED:
        return ReapVerdict(False, f"worker is {worker_state}: never reaped")
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


def retire_due(state_since: datetime, retire_after: float) -> datetime:
    """When a ``lost`` worker whose reap is done is retired automatically (UTC)."""
    return state_since + timedelta(seconds=retire_after)


def may_retire(
    automatic: bool,
    worker_state: str | None,
    reap_done: bool,
    state_since: datetime | None,
    fleet: FleetState | str,
    now: datetime,
    retire_after: float,
) -> ReapVerdict:
    """Whether a worker may be retired now (CONTRACT.md §5.1).

    An operator's or agent's ``retire`` acts at once, with no disruption guard and no rate
    limit, for any known worker that is not retired already. An automatic retirement
    (Nomad's node GC after ``node_gc_threshold``) needs the worker ``lost`` for
    ``retire_after`` seconds since ``state_since``, its reap done, and the fleet not in full
    disruption (like every automatic destroy, rule 6).

    Args:
        automatic: no operator asked; the controller's own decision.
        worker_state: the recorded state, ``None`` for an unknown worker.
        reap_done: the worker's tasks were reaped after it was lost.
        state_since: when it entered ``worker_state`` (UTC).
        fleet: the fleet's disruption state.
        now: the controller's clock (UTC).
        retire_after: ``REAPER_RETIRE_AFTER`` in seconds.
    """
    if worker_state is None:
        return ReapVerdict(False, "unknown worker")
    if worker_state == "retired":
        return ReapVerdict(False, "already retired")
    if not automatic:
        return ReapVerdict(True)
    if worker_state != "lost" or not reap_done or state_since is None:
        return ReapVerdict(False, f"worker is {worker_state}, not lost and reaped")
    if FleetState(fleet) is FleetState.full:
        return ReapVerdict(False, "fleet in full disruption")
    due = retire_due(state_since, retire_after)
    if now < due:
        return ReapVerdict(False, "not lost for RETIRE_AFTER yet", due)
    return ReapVerdict(True)


def retire_is_stale(retire_boot: str | None, current_boot: str | None) -> bool:
    """Whether a ``retire`` is ignored because it speaks for a boot that is gone.

    ``retire`` may name the boot it retires (``boot_id``; the reference agent sends its own
    on a planned shutdown). A retire that Temporal delivered late, after the host restarted
    and a new boot beat, must not retire the new boot: its beats would be ignored for ever
    and a live host would silently leave the fleet (found by the chaos campaign, seed 3).
    A retire that names no boot (an operator's, a v1.1 client's) acts as CONTRACT.md §5.1
    says.

    Args:
        retire_boot: the ``boot_id`` the signal names, or ``None``.
        current_boot: the worker's current boot id in its liveness, or ``None`` (never beat).
    """
    return retire_boot is not None and retire_boot != current_boot
