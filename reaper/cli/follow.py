"""What ``reaper events --follow`` has printed, so that no committed row is missed.

An event's ``id`` is drawn from a sequence when its row is written, and transactions commit
in another order: a reap held on a lock may commit id 100 after id 101 was printed. Asking
for ``id > last printed`` would then skip 100 for ever (found by the upgrade test,
2026-12-03). So the follower keeps a floor, the highest id below which every id has been
seen committed (all kinds, whatever the filters), asks for rows above the floor, and prints
each row once. A gap that stays open for :data:`GAP_WAIT_S` is a rolled-back transaction's
id, or a row deleted: it is given up. (A transaction already open when following starts, with
an id below the newest, is not awaited: the timeline printed at the start ends there.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

GAP_WAIT_S = 120.0
"""How long a missing id is waited for (seconds): longer than any reaper transaction holds
an id before it commits (activities time out after 15 s; a lock waits 3 s)."""


@dataclass
class FollowWindow:
    """The floor and what has been seen and printed above it.

    Args:
        floor: every id at or below it is done with (the newest id when following starts).
    """

    floor: int
    seen: set[int] = field(default_factory=set)
    """Ids above the floor committed so far (any kind)."""
    printed: set[int] = field(default_factory=set)
    """Ids above the floor already printed (those matching the filters)."""
    gap_since: dict[int, float] = field(default_factory=dict)
    """Missing id -> when it was first noticed missing (monotonic seconds)."""

    def fresh(self, matching: Iterable[int]) -> list[int]:
        """Of the ids of rows matching the filters just read above the floor, those not
        printed yet (to print now), in order; they count as printed."""
        new = sorted(i for i in matching if i > self.floor and i not in self.printed)
        self.printed.update(new)
        return new

    def advance(self, committed: Iterable[int], now: float) -> None:
        """Record the ids committed above the floor (every kind) and raise the floor over
        every id below which nothing is awaited any more; ``now`` is monotonic seconds."""
        self.seen.update(i for i in committed if i > self.floor)
        while self.seen:
            nxt = self.floor + 1
            if nxt in self.seen:
                self.floor = nxt
                self.seen.discard(nxt)
                self.printed.discard(nxt)
                self.gap_since.pop(nxt, None)
                continue
            noticed = self.gap_since.setdefault(nxt, now)
            if now - noticed < GAP_WAIT_S:
                return
            self.floor = nxt  # given up: rolled back, or deleted
            self.gap_since.pop(nxt, None)
