"""The host rotations' invariants (CONTRACT.md §6.1) on a task's ``stopped`` events row, as
the checker (chaos/checker.py) applies them: an original stopped ``drained`` only once its
replacement was reported running, a task stopped at a drain's deadline only once a rotation's
deadline had come, a replacement stopped ``undrained`` only after an ``undrain`` of the
drained worker. A service's count above ``desired_count + max_surge`` is
``rules.above_count``; a deadline's stop in full disruption, rule 6, the checker's ``full``.
"""

from __future__ import annotations

import re

from chaos import rules
from chaos.ledger import Ledger
from chaos.observe import Event, Observations
from chaos.rules import Violation, stamp
from chaos.settings import CLOCK_TOL_S
from reaper.core.policy import migration

MIGRATION = (migration.DRAINED, migration.DEADLINE, migration.UNDRAINED)
"""The ``stop_reason`` words of a migration's stops (CONTRACT.md §6.1), which its ``stopped``
events' reasons start with."""
TOL = CLOCK_TOL_S


def migration_stop(e: Event, what: str, obs: Observations, ledger: Ledger) -> list[Violation]:
    """§6.1: an original stops (``drained``) only once its replacement runs; a task stops
    at a drain's deadline (``drain-deadline``) only once a rotation's deadline has come
    (and not in full disruption: rule 6, which the checker applies); a replacement stops
    ``undrained`` only after an ``undrain`` of the drained worker. Returns what ``e`` broke."""
    found: list[Violation] = []
    word = e.reason.split(":")[0]
    if word == migration.DRAINED:
        m = re.search(r"its replacement (\S+) runs", e.reason)
        replacement = m.group(1) if m else ""
        placed = obs.tasks.get(replacement)
        on = placed[1] if placed is not None else None
        beats = (
            ledger.beats.get(on, [])
            if on is not None
            else [b for bs in ledger.beats.values() for b in bs]
        )
        if rules.reported_by(beats, replacement, e.at, TOL) is None:
            found.append(
                Violation(
                    "§6.1: original stopped before its replacement ran",
                    what,
                    f"stopped at {stamp(e.at)} ({e.reason}); no beat of "
                    f"{on or 'any agent'} sent by then reported {replacement or '?'}",
                    e.at,
                )
            )
    elif word == migration.DEADLINE:
        w = e.worker or ""
        rotations = ledger.sent(w, "rotate")
        if not rules.deadline_came(e.at, rotations, TOL):
            first = min((c.sent + (c.deadline or 0.0) for c in rotations), default=None)
            found.append(
                Violation(
                    "§6.1: stopped at a drain deadline that had not come",
                    what,
                    f"stopped at {stamp(e.at)}; "
                    + (
                        f"the earliest deadline of a rotation of {w} was {stamp(first)}"
                        if first is not None
                        else f"no rotation of {w} was sent"
                    ),
                    e.at,
                )
            )
    elif word == migration.UNDRAINED:
        m = re.search(r"the drain of (\S+) ended", e.reason)
        w = m.group(1) if m else ""
        if not rules.sent_by(e.at, ledger.sent(w, "undrain"), TOL):
            found.append(
                Violation(
                    "§6.1: replacement stopped as undrained without an undrain",
                    what,
                    f"stopped at {stamp(e.at)} ({e.reason}); no undrain of {w or '?'} "
                    "was sent by then",
                    e.at,
                )
            )
    return found
