"""What ``reaper explain worker W`` adds for a draining worker (CONTRACT.md §6): drained, or
where each task of its migration stands. Pure: facts in, notes out; UTC times."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from reaper.core.policy.explain import clock


@dataclass(frozen=True)
class MigrationFacts:
    """One task of a draining worker and its newest replacement (§6.1), as Postgres holds
    them (``reaper.cli.read.migration_rows``)."""

    task: str
    state: str
    stop_reason: str | None
    replacement: str | None
    replacement_worker: str | None
    replacement_state: str | None


def explain_drain(
    migrate_until: datetime | None,
    drained_at: datetime | None,
    tasks: list[MigrationFacts],
    now: datetime,
) -> list[str]:
    """Notes on a draining worker (CONTRACT.md §6): drained, or its migration (deadline, and
    where each task it still holds stands: its replacement placed, running, or waiting for
    the service's ``max_surge`` or for capacity); ``now`` UTC."""
    if drained_at is not None:
        return [f"drained since {clock(drained_at)}: it holds no pending or running task"]
    if migrate_until is None or migrate_until <= now:
        return ["its tasks stay until they end (a drain without --migrate)"]
    notes = [f"migrating until {clock(migrate_until)}: what is left then is stopped"]
    for t in tasks:
        if t.state not in ("pending", "running"):
            continue
        if t.replacement is None or t.replacement_state not in ("pending", "running"):
            notes.append(f"{t.task}: waits for a replacement (max_surge, or no capacity)")
        elif t.replacement_state == "running":
            notes.append(f"{t.task}: replacement {t.replacement} runs; it stops next")
        else:
            where = t.replacement_worker or "no worker yet (owed)"
            notes.append(f"{t.task}: replacement {t.replacement} placed on {where}, not running")
    return notes
