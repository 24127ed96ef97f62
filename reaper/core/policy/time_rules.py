"""Every rule that can become true by time alone, with the timer that keeps it.

A rule that falls due only because something else happened to trigger a pass breaks
silently when that pass goes away: since diffs became change-driven, rows left ``creating``
waited for the 10-minute full resync (issue 19). So each time rule declares when it is next
due, the workflow that owns it keeps one timer for the earliest of its rules, and
``tests/workflows/test_time_rules.py`` proves each one fires within its bound with the full
resync switched off. A new time rule is a row here and a scenario there (the test fails on a
rule without one).

Three owners keep timers:

- ``WorkerLiveness`` (one per worker): one deadline timer for the earliest of its rules
  (``liveness_machine.next_deadline``).
- ``HandleCollector`` (one per worker): per kind, the earliest of its rules
  (``KindStatus.recheck_at``); when it falls due it asks the liveness for the next report,
  and the rule is applied on that report (rule 4: a destroy needs fresh evidence).
- ``FleetMonitor`` (one per task queue): a check every ``HEARTBEAT_INTERVAL``.

Rules that need no timer are listed too, with the reason (``timer`` ``None``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from reaper.core.models import Timings

LIVENESS = "WorkerLiveness"
COLLECTOR = "HandleCollector"
MONITOR = "FleetMonitor"


@dataclass(frozen=True)
class TimeRule:
    """One rule that can become true by time alone.

    Attributes:
        name: short id, used by the test that proves it fires.
        owner: the workflow that keeps its timer.
        due: when it falls due, in words (UTC times, settings by name).
        fires: what happens then.
        timer: where its due time is computed and the timer armed; ``None`` when no timer is
            needed, with ``fires`` saying why.
        bound: seconds after its due time within which it has fired, at the latest, for the
            given timings (on a controller that is up and not behind).
    """

    name: str
    owner: str
    due: str
    fires: str
    timer: str | None
    bound: Callable[[Timings], float]


def _beat(t: Timings) -> float:
    """One heartbeat interval: the collector's rules act on the next report after they fall
    due, which comes within one interval, plus a second of processing."""
    return t.heartbeat_interval + 1.0


def _check(t: Timings) -> float:
    """The fleet monitor checks every heartbeat interval: two of them at most (§5.1)."""
    return 2 * t.heartbeat_interval


def _deadline(t: Timings) -> float:
    """The liveness's timer fires 0.25 s after its deadline (``DEADLINE_SLACK_S``); a
    second of processing."""
    return 1.0


TIME_RULES: tuple[TimeRule, ...] = (
    TimeRule(
        "stall",
        LIVENESS,
        "last heartbeat + STALL_AFTER",
        "the worker becomes stalled (its reports decide nothing, rule 1)",
        "policy.liveness.next_deadline",
        _deadline,
    ),
    TimeRule(
        "lost",
        LIVENESS,
        "last heartbeat + LOST_AFTER, never before an outage grace ends",
        "the worker becomes lost and its reap starts (rule 5)",
        "policy.liveness.next_deadline",
        _deadline,
    ),
    TimeRule(
        "outage-grace",
        LIVENESS,
        "a deadline judged more than a heartbeat interval late: STALL_AFTER after that"
        " (one-grace: once per disruption, renewed by a beat or a look on time)",
        "the worker's silence counts again (rule 8: a controller outage reaps nobody)",
        "policy.liveness.next_deadline (grace_until)",
        _deadline,
    ),
    TimeRule(
        "reap-retry",
        LIVENESS,
        "a refused reap's retry time: the fleet's fresh LOST_AFTER after a full disruption"
        " (rule 6), a reap token (REAPER_REAP_RATE), STALL_AFTER after a disruption refusal",
        "the reap is tried again",
        "liveness_machine.next_deadline (reap_retry_at)",
        _deadline,
    ),
    TimeRule(
        "retire-after",
        LIVENESS,
        "state_since of a lost worker whose reap is done + RETIRE_AFTER",
        "the worker is retired automatically (§5.1)",
        "liveness_machine.automatic_retire_due",
        _deadline,
    ),
    TimeRule(
        "retire-retry",
        LIVENESS,
        "a refused automatic retirement's retry time (STALL_AFTER later, or when due)",
        "the retirement is tried again",
        "liveness_machine.next_deadline (retire_retry_at)",
        _deadline,
    ),
    TimeRule(
        "missing-ttl",
        COLLECTOR,
        "the oldest missing_since of a kind + how long the kind waits (MISSING_TTL)",
        "the next report is reconciled, and what it still lacks is destroyed (rule 4)",
        "policy.collection.next_due",
        _beat,
    ),
    TimeRule(
        "destroy-retry",
        COLLECTOR,
        "a refused destroy (stalled worker, full disruption) + STALL_AFTER",
        "the destroy is tried again on the next report",
        "policy.collection.destroy_retry_due",
        _beat,
    ),
    TimeRule(
        "orphan",
        COLLECTOR,
        "first report of a handle the database does not hold + MISSING_TTL",
        "the handle is listed in the worker's orphans (CONTRACT.md §2)",
        "KindStatus.recheck_due (activities/collection.py)",
        _beat,
    ),
    TimeRule(
        "creating-timeout",
        COLLECTOR,
        "the oldest row still being created of a kind + CREATING_TIMEOUT",
        "the row is failed and collected, one destroyed event (reason creating-timeout)",
        "policy.collection.creating_due, in KindStatus.recheck_due",
        _beat,
    ),
    TimeRule(
        "owed-work",
        MONITOR,
        "a placeable worker appears while replacements are owed",
        "owed replacements are placed (§5.1: within 2 x HEARTBEAT_INTERVAL)",
        "workflows/fleet.py (a check every HEARTBEAT_INTERVAL)",
        _check,
    ),
    TimeRule(
        "strays",
        MONITOR,
        "a task placed on a worker that is lost and reaped, or retired",
        "the stray is reaped and replaced (Kubernetes #12545)",
        "workflows/fleet.py (a check every HEARTBEAT_INTERVAL)",
        _check,
    ),
    TimeRule(
        "change-feed",
        MONITOR,
        "a scheduler's change to a worker's rows",
        "the worker's next report is diffed (§5.3: within RESYNC_INTERVAL + 2 x"
        " HEARTBEAT_INTERVAL)",
        "workflows/fleet.py (a check every HEARTBEAT_INTERVAL)",
        _check,
    ),
    TimeRule(
        "repair",
        MONITOR,
        "a running or stalled row LOST_AFTER + STALL_AFTER + 2 heartbeat intervals + 10 s"
        " after its last heartbeat, or a lost one overdue for retirement",
        "its liveness is looked at, and reset if stuck (docs/stale-clock.md)",
        "workflows/fleet.py (a check every HEARTBEAT_INTERVAL)",
        _check,
    ),
    TimeRule(
        "row-refresh",
        LIVENESS,
        "workers.last_heartbeat_at lags the liveness by STALL_AFTER less half an interval",
        "no timer: only an accepted beat makes the row lag, and that beat's workflow task"
        " writes it (§5.3); a silent worker's row is written by its state change",
        None,
        _deadline,
    ),
    TimeRule(
        "full-resync",
        LIVENESS,
        "an unchanged report FULL_RESYNC_INTERVAL after the last diff",
        "no timer: a safety net for writes the change feed cannot see (triggers disabled,"
        " TRUNCATE), applied to the next report; no rule above depends on it",
        None,
        _beat,
    ),
    TimeRule(
        "operator-signal-window",
        LIVENESS,
        "a signed operator signal 5 minutes from signed_at (§5.2)",
        "no timer: the window is checked when a signal arrives, and the signatures a"
        " liveness remembers against replays are pruned then; nothing falls due",
        None,
        _deadline,
    ),
)
"""Every time rule, by owner."""


def timed() -> list[TimeRule]:
    """The rules a timer keeps (those a test must see fire)."""
    return [rule for rule in TIME_RULES if rule.timer is not None]
