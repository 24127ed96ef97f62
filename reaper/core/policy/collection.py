"""Collection policy: what a complete report marks and clears, and when a handle is destroyed.

CONTRACT.md rules 1-4, after Concourse's ``atc/gc`` (mark ``missing_since``, wait out the TTL,
recheck, destroy). Pure functions; times are UTC ``datetime``s, durations seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


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


