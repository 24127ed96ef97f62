"""The campaign's timings and every bound the checker derives from them.

All durations are seconds. The controller runs with short timings that satisfy the
validation of ``reaper.core.config`` (``STALL_AFTER >= 2 * HEARTBEAT_INTERVAL``,
``LOST_AFTER > STALL_AFTER``, ``MISSING_TTL >= 3 * HEARTBEAT_INTERVAL``,
``RESYNC_INTERVAL >= HEARTBEAT_INTERVAL``); the checker's tolerances come from these
timings and from the contract's bounds (CONTRACT.md rule 8, §5.1), never from measurements.
"""

from __future__ import annotations

from reaper.core import kinds
from reaper.core.policy import rollout
from reaper.core.policy.collection import destroy_after
from workflows.common import ACTIVITY_TIMEOUT, RETRY

HEARTBEAT_S = 1.0
"""``REAPER_HEARTBEAT_INTERVAL``: the simulated agents beat this often."""
STALL_AFTER_S = 5.0
"""``REAPER_STALL_AFTER``: five intervals, not the two the validation allows. On two busy
cores (load 12 and more, seen here) a replica may take 3-4 s to start a workflow task;
with ``STALL_AFTER`` 3 s nearly every beat was then a return (rule 4 restarts every mark),
and the campaign destroyed almost nothing."""
LOST_AFTER_S = 12.0
"""``REAPER_LOST_AFTER``."""
MISSING_TTL_S = 5.0
"""``REAPER_MISSING_TTL``."""
LONGEST_WAIT_S = max(MISSING_TTL_S, *(destroy_after(k, MISSING_TTL_S) for k in kinds.REPORTS))
"""The longest a handle or an orphan waits before it is dealt with: ``MISSING_TTL`` (an
orphan) or as long as the slowest kind waits when missing (``policy.collection.destroy_after``)."""
RESYNC_S = 2.0
"""``REAPER_RESYNC_INTERVAL``."""
STICKY_S = 2.0
"""``REAPER_STICKY_TIMEOUT``: a SIGKILLed replica's cached workflows move after this long."""
DISRUPTION_THRESHOLD = 0.55
"""``REAPER_DISRUPTION_THRESHOLD`` (the default)."""
PEER_VERSION = rollout.DEFAULT_PEER_VERSION
"""``REAPER_PEER_VERSION`` unless ``--peer-version`` says otherwise: the default, the command
changes a fleet runs until an operator raises it (``reaper.core.policy.rollout``)."""

CONTROLLER_ENV = {
    "REAPER_HEARTBEAT_INTERVAL": f"{HEARTBEAT_S:g}s",
    "REAPER_STALL_AFTER": f"{STALL_AFTER_S:g}s",
    "REAPER_LOST_AFTER": f"{LOST_AFTER_S:g}s",
    "REAPER_MISSING_TTL": f"{MISSING_TTL_S:g}s",
    "REAPER_RESYNC_INTERVAL": f"{RESYNC_S:g}s",
    "REAPER_STICKY_TIMEOUT": f"{STICKY_S:g}s",
    "REAPER_DISRUPTION_THRESHOLD": f"{DISRUPTION_THRESHOLD:g}",
    "REAPER_METRICS_PORT": "0",
    "REAPER_SDK_METRICS_PORT": "0",
}
"""The environment of every controller replica (``REAPER_*``), with ``REAPER_PEER_VERSION``."""

CLOCK_TOL_S = 0.5
"""Slack between timestamps of the campaign (``time.time()``), the Temporal server
(``workflow.now()``) and Postgres (``now()``): one host, one system clock, so this covers
only the rounding of the stored values and the instant a timestamp is read within a call."""

RESUME_S = 30.0
"""CONTRACT.md rule 8: work interrupted by a controller crash resumes within 30 s."""
RETRY_MAX_S = RETRY.maximum_interval.total_seconds() if RETRY.maximum_interval else 10.0
"""Longest wait between two attempts of an activity (``workflows.common.RETRY``): after a
long Postgres outage the next attempt may be this far off."""
ATTEMPT_S = ACTIVITY_TIMEOUT.total_seconds()
"""An activity attempt's ``start_to_close`` (``workflows.common.ACTIVITY_TIMEOUT``)."""

SETTLE_BOUND_S = (
    RESUME_S
    + RETRY_MAX_S
    + LOST_AFTER_S
    + STALL_AFTER_S
    + LONGEST_WAIT_S
    + RESYNC_S
    + 2 * HEARTBEAT_S
)
"""After the last fault has ended, everything due must be done within this: work resumes
(rule 8, plus one retry interval), a silent worker is judged lost (``LOST_AFTER``, after at
most one outage grace of ``STALL_AFTER``) and reaped, an absent handle is marked within
``RESYNC_INTERVAL + 2 x HEARTBEAT_INTERVAL`` (§5.3) and destroyed as long as its kind waits
later (at most ``LONGEST_WAIT_S``), replacements placed within ``2 x HEARTBEAT_INTERVAL``
(§5.1)."""

OWED_BOUND_S = 2 * HEARTBEAT_S
"""§5.1: an owed replacement is placed within ``2 x HEARTBEAT_INTERVAL`` of a healthy,
non-draining worker becoming available."""
QUIET_BEFORE_S = RESUME_S + ATTEMPT_S
"""The per-step owed-work check applies only this long after the last fault ended: a
replica restarted resumes within rule 8's 30 s, and an attempt in flight may hold its
transaction for one ``start_to_close``."""

OBSERVE_EVERY_S = 0.5
"""How often the checker reads Postgres between rounds."""
ROUND_S = (1.0, 2.0)
"""A round lasts a time drawn from this range (uniform)."""

AGENTS_AT_START = 6
"""Simulated agents registered before the first round."""
AGENTS_MAX = 9
"""At most this many agents ever join."""
