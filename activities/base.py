"""What every activity class shares: the pool, the settings, and the events writer."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import asyncpg
from temporalio import activity

from reaper.core import kinds
from reaper.core.config import Settings

log = logging.getLogger("reaper.events")
"""One INFO line per ``events`` row written (destroy, stop, reap, replacement, state change,
drain, orphan), with ``worker``, ``kind``, ``handle``, ``action``, ``reason``, ``actor`` and
``workflow_id`` as fields (:mod:`reaper.logs`)."""

EVENT_KIND = {k.report: k.word for k in kinds.ALL}
"""Report kind -> ``events.kind`` (CONTRACT.md §3)."""


class ActivityBase:
    """Holds the asyncpg pool and settings; keeps no per-call state (activities run concurrently).

    Args:
        pool: an open asyncpg pool on the reaper database (schema ``reaper`` migrated), for
            heartbeats, reaps and the fleet.
        settings: controller settings; activities read only dry-run and thresholds from it.
        gc_pool: a pool of its own for garbage collection (``reconcile_report``,
            ``destroy_missing``), so that collections blocked on a locked table never hold
            the connections heartbeats and reaps need (issue 11); ``pool`` when omitted.
    """

    def __init__(
        self, pool: asyncpg.Pool, settings: Settings, gc_pool: asyncpg.Pool | None = None
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.gc_pool = gc_pool if gc_pool is not None else pool


async def write_events(
    conn: asyncpg.Connection,
    worker: str | None,
    kind: str,
    action: str,
    handles: Sequence[str | None],
    reason: str | None,
    actor: str | None = None,
    *,
    dry_run: bool = False,
    dedupe: Sequence[str] | None = None,
) -> list[str | None]:
    """Insert one ``reaper.events`` row per handle (``would-<action>`` in a dry run).

    Callers run this in the same transaction as the change it records, so a retried
    activity that finds nothing left to change writes no second row (CONTRACT.md §3).
    Where nothing changes (a dry run), ``dedupe`` gives one key per handle instead: a row
    whose key exists already is not written again.

    Logs one line per row actually written (a row skipped by ``dedupe`` is not logged
    again), in the transaction that writes it.

    Returns:
        The handles whose rows were written.
    """
    if not handles:
        return []
    rows = await conn.fetch(
        "INSERT INTO reaper.events (worker, kind, handle, action, reason, actor, dedupe)"
        " SELECT $1, $2, h, $4, $5, $6, d"
        " FROM unnest($3::text[], $7::text[]) AS x(h, d)"
        " ON CONFLICT (dedupe) DO NOTHING RETURNING handle, action",
        worker,
        kind,
        list(handles),
        f"would-{action}" if dry_run else action,
        reason,
        actor,
        list(dedupe) if dedupe is not None else [None] * len(handles),
    )
    workflow_id = activity.info().workflow_id if activity.in_activity() else None
    for r in rows:
        handle = r["handle"]
        what = r["action"] if handle in (None, worker) else f"{r['action']} {kind} {handle}"
        log.info(
            "%s: %s%s",
            worker or "fleet",
            what,
            f" ({reason})" if reason else "",
            extra={
                "worker": worker,
                "kind": kind,
                "handle": r["handle"],
                "action": r["action"],
                "reason": reason,
                "actor": actor,
                "workflow_id": workflow_id,
            },
        )
    return [r["handle"] for r in rows]


def per_kind(template: str, only: tuple[kinds.Kind, ...] = kinds.ALL) -> dict[str, str]:
    """Expand a statement written with ``{table}`` and ``{key}`` for each kind's fixed names
    (``reaper.core.kinds``; table names are fixed identifiers, never input), keyed by report
    kind; ``only`` those kinds."""
    return {k.report: template.replace("{table}", k.table).replace("{key}", k.key) for k in only}


def unique(items: Iterable[str]) -> list[str]:
    """Items without repeats, first occurrence order kept."""
    return list(dict.fromkeys(items))


def command_count(command_tag: str) -> int:
    """Rows affected, from an asyncpg command tag such as ``UPDATE 3``."""
    return int(command_tag.rsplit(" ", 1)[-1])


async def column(conn: asyncpg.Connection, statement: str, *args: object) -> list[str]:
    """The first column of every row a statement returns."""
    return [r[0] for r in await conn.fetch(statement, *args)]
