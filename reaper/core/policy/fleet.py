"""Fleet policy: the disruption state (CONTRACT.md rule 6) and whether a worker may be reaped.

After Kubernetes' node lifecycle controller (zone states ``Normal``, ``PartialDisruption``,
``FullDisruption``). Pure functions; times are UTC ``datetime``s, durations seconds.
"""

from __future__ import annotations

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


