"""The SQL of report garbage collection: marks on the rows, or in ``reaper.dry_marks``.

The verbs follow Concourse's ``atc/db`` (``UpdateContainersMissingSince``,
``RemoveMissingContainers``): each statement is guarded by the state it expects, so a race
or a retry turns into "0 rows", never into harm, and only rows whose ``missing_since``
actually changes are written (rule 3). Table names come from fixed maps, never from input;
every value is a parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

from activities.base import per_kind
from reaper.core import kinds
from reaper.core.kinds import HANDLE_ROWS, TASK_ROWS
from reaper.core.states import MARKABLE

__all__ = ["MARKABLE"]

REPORT = "pg_temp.reaper_report"
"""The report being reconciled (its handles, a staged one's possibly repeated): a temporary
table of the connection, emptied at commit.

The report is sent to Postgres once (COPY, or straight from ``reaper.report_chunks`` when it
was staged) and every statement joins against it; shipping a 100,000-handle array to each
statement cost four times the transfer and parse (BENCHMARKS.md, metric 3a)."""
CREATE_REPORT = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {REPORT.split('.')[1]} (h text NOT NULL)"
    " ON COMMIT DELETE ROWS"
)
IN_REPORT = f"IN (SELECT h FROM {REPORT})"
DIFF = "pg_temp.reaper_diff"
"""The report diffed against the worker's rows once, both ways: ``absent`` rows of the worker
that the report lacks (``h`` their handle), and handles of the report that no row of the
worker holds (``absent`` false). A temporary table of the connection, emptied at commit.

One full join instead of an anti-join each way: the two hash joins over the whole report
and all the worker's rows took two thirds of a 100,000-handle reconcile (BENCHMARKS.md,
metric 3a); marks and unknown handles are then looked up among the few rows that differ."""
PREPARE_DIFF = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {DIFF.split('.')[1]}"
    " (h text NOT NULL, absent boolean NOT NULL) ON COMMIT DELETE ROWS;"
    " SET LOCAL work_mem = '32MB'"
)
"""Create ``DIFF`` if needed, and for the rest of the reconcile's transaction let the full
join's hash of a 100,000-row worker (about 6 MB) stay in memory instead of spilling to disk
in two batches at the default 4 MB: 30% faster (BENCHMARKS.md, metric 3a). ``work_mem`` caps
each hash, it allocates nothing: small reports use what they need. (Two statements, one
round trip; no parameters.)"""
DIFF_REPORT = per_kind(
    f"INSERT INTO {DIFF} (h, absent) SELECT coalesce(t.k, r.h), r.h IS NULL"
    f" FROM {REPORT} r FULL JOIN (SELECT {{key}} AS k FROM {{table}} WHERE worker = $1) t"
    " ON t.k = r.h WHERE r.h IS NULL OR t.k IS NULL"
)
"""Fill ``DIFF`` from ``REPORT`` and the worker's ($1) rows (a handle the report repeats
and no row holds is in it as often)."""
UNKNOWN_AFTER_DELETE = (
    f"INSERT INTO {DIFF} (h, absent) SELECT r.h, false FROM {REPORT} r WHERE r.h = ANY($1::text[])"
)
"""Reported handles ($1) whose rows this transaction has just deleted are unknown now."""

# Rows of the worker absent from the report, markable, whose state was set before the
# report was taken (rule 2). $2 taken_at, $3 markable states.
# (An array of the few differing handles, so that they are looked up by the table's primary
# key: joined, the planner hashes all the worker's rows instead.)
ABSENT = (
    f"t.{{key}} = ANY(ARRAY(SELECT d.h FROM {DIFF} d WHERE d.absent)) AND t.worker = $1"
    " AND t.state = ANY($3::text[]) AND t.state_changed_at <= $2"
)


@dataclass(frozen=True)
class MarkStore:
    """Where marks live: ``missing_since`` on the rows, or ``reaper.dry_marks`` in a dry run.

    Each attribute is one statement per kind. Parameters: $1 worker, then as noted; the
    report itself is the table ``REPORT``.
    """

    clear: dict[str, str]  # reported handles -> rows cleared
    restart: dict[str, str]  # $2 also_seen, $3 taken_at
    mark: dict[str, str]  # $2 taken_at, $3 markable -> handles marked
    status: dict[str, str]  # -> n, oldest (not yet destroyed)
    held: dict[str, str]  # $2 markable -> rows a report could drop
    restart_all: dict[str, str]  # $2 taken_at: every mark of the kind restarts


HELD = per_kind("SELECT count(*) FROM {table} WHERE worker = $1 AND state = ANY($2::text[])")

ROWS = MarkStore(
    clear=per_kind(
        "UPDATE {table} SET missing_since = NULL"
        " WHERE worker = $1 AND missing_since IS NOT NULL AND {key} " + IN_REPORT
    ),
    # Marked rows that a superseded report still held were seen after their mark: their
    # clock restarts (rule 4: every report since missing_since must lack the handle).
    restart=per_kind(
        "UPDATE {table} SET missing_since = $3"
        " WHERE worker = $1 AND missing_since IS NOT NULL AND missing_since < $3"
        " AND {key} = ANY($2::text[])"
    ),
    mark=per_kind(
        "UPDATE {table} AS t SET missing_since = $2 WHERE "
        + ABSENT
        + " AND t.missing_since IS NULL RETURNING t.{key}"
    ),
    status=per_kind(
        "SELECT count(*) AS n, min(missing_since) AS oldest FROM {table}"
        " WHERE worker = $1 AND missing_since IS NOT NULL"
    ),
    held=HELD,
    restart_all=per_kind(
        "UPDATE {table} SET missing_since = $2"
        " WHERE worker = $1 AND missing_since IS NOT NULL AND missing_since < $2"
    ),
)


def dry_marks_per_kind(template: str) -> dict[str, str]:
    """``per_kind`` for statements on ``reaper.dry_marks``, whose ``kind`` column names the kind."""
    return {k: v.replace("{kind}", k) for k, v in per_kind(template).items()}


DRY = MarkStore(
    clear=dry_marks_per_kind(
        "DELETE FROM reaper.dry_marks WHERE worker = $1 AND kind = '{kind}' AND handle " + IN_REPORT
    ),
    restart=dry_marks_per_kind(
        "UPDATE reaper.dry_marks SET missing_since = $3, done = false"
        " WHERE worker = $1 AND kind = '{kind}' AND missing_since < $3"
        " AND handle = ANY($2::text[])"
    ),
    mark=dry_marks_per_kind(
        "INSERT INTO reaper.dry_marks (worker, kind, handle, missing_since)"
        " SELECT $1, '{kind}', t.{key}, $2 FROM {table} t WHERE "
        + ABSENT
        + " ON CONFLICT DO NOTHING RETURNING handle"
    ),
    status=dry_marks_per_kind(
        "SELECT count(*) AS n, min(missing_since) FILTER (WHERE NOT done) AS oldest"
        " FROM reaper.dry_marks d WHERE worker = $1 AND kind = '{kind}'"
        " AND EXISTS (SELECT 1 FROM {table} t WHERE t.{key} = d.handle AND t.worker = $1)"
    ),
    held=HELD,
    restart_all=dry_marks_per_kind(
        "UPDATE reaper.dry_marks SET missing_since = $2, done = false"
        " WHERE worker = $1 AND kind = '{kind}' AND missing_since < $2"
    ),
)

# Reported handles the database does not hold for this worker: remember when first seen,
# forget those no longer reported; the ones older than MISSING_TTL are orphans.
UNKNOWN = per_kind(
    f"WITH u AS (SELECT DISTINCT d.h FROM {DIFF} d WHERE NOT d.absent),"
    " ins AS (INSERT INTO reaper.unknown_handles (worker, kind, handle, first_seen)"
    "  SELECT $1, $2, h, $3 FROM u ON CONFLICT DO NOTHING),"
    " del AS (DELETE FROM reaper.unknown_handles x WHERE x.worker = $1 AND x.kind = $2"
    "  AND NOT EXISTS (SELECT 1 FROM u WHERE u.h = x.handle))"
    " SELECT x.handle, x.first_seen FROM reaper.unknown_handles x JOIN u ON u.h = x.handle"
    " WHERE x.worker = $1 AND x.kind = $2 AND x.first_seen <= $4 ORDER BY x.handle"
)
NEXT_ORPHAN = (
    "SELECT min(first_seen) FROM reaper.unknown_handles"
    " WHERE worker = $1 AND kind = $2 AND first_seen > $3"
)
"""$3 the orphan cutoff: when the oldest unknown handle that is not an orphan yet was first
reported (it becomes one ``MISSING_TTL`` later; the collector asks for a report then)."""
REMOVE_MISSING = per_kind(
    "DELETE FROM {table} WHERE worker = $1 AND missing_since IS NOT NULL"
    " AND missing_since <= $2 AND state = ANY($3::text[])"
    " RETURNING {key} AS handle, NULL::text AS service, missing_since",
    HANDLE_ROWS,
) | per_kind(
    "UPDATE {table} SET state = $4, stop_reason = 'missing', missing_since = NULL"
    " WHERE worker = $1 AND missing_since IS NOT NULL AND missing_since <= $2"
    " AND state = ANY($3::text[])"
    " RETURNING {key} AS handle, service, $2::timestamptz AS missing_since",
    TASK_ROWS,
)
"""$4 (tasks): what a destroy makes of a task (``reaper.core.states.DESTROYED``)."""
WOULD_REMOVE_MISSING = {
    kind: sql.replace("{service}", "t.service" if kinds.kind(kind).task else "NULL::text")
    for kind, sql in dry_marks_per_kind(
        "UPDATE reaper.dry_marks d SET done = true FROM {table} t"
        " WHERE d.worker = $1 AND d.kind = '{kind}' AND NOT d.done AND d.missing_since <= $2"
        " AND t.{key} = d.handle AND t.worker = $1 AND t.state = ANY($3::text[])"
        " RETURNING d.handle, {service} AS service, d.missing_since"
    ).items()
}
# Rows still being created ($3, ``states.BEING_CREATED``) since $2 or earlier: their creator
# crashed (CREATING_TIMEOUT).
FAIL_STUCK_CREATING = per_kind(
    "DELETE FROM {table} WHERE worker = $1 AND state = ANY($3::text[])"
    " AND state_changed_at <= $2 RETURNING {key} AS handle",
    HANDLE_ROWS,
)
CREATING = per_kind(
    "SELECT min(state_changed_at) FILTER (WHERE state_changed_at > $3) AS upcoming,"
    " count(*) FILTER (WHERE state_changed_at <= $3) AS overdue"
    " FROM {table} WHERE worker = $1 AND state = ANY($2::text[])",
    HANDLE_ROWS,
)
"""The worker's rows still being created ($2): when the oldest one not yet timed out at the
cutoff $3 entered that state (it times out ``CREATING_TIMEOUT`` later,
``policy.collection.creating_due``), and how many are past it and still there (held by a
full disruption)."""
WOULD_FAIL_STUCK_CREATING = per_kind(
    "SELECT {key} AS handle FROM {table} WHERE worker = $1 AND state = ANY($3::text[])"
    " AND state_changed_at <= $2",
    HANDLE_ROWS,
)


LOAD_STAGED = (
    "WITH c AS (SELECT handles FROM reaper.report_chunks WHERE worker = $1"
    " AND kind = $2 AND report_id = $3),"
    f" ins AS (INSERT INTO {REPORT} (h) SELECT unnest(handles) FROM c)"
    " SELECT count(*) FROM c"
)
"""Copy a staged report into ``REPORT`` inside Postgres; returns the chunks found. Repeats
are kept (every statement on ``REPORT`` asks whether a handle is in it; ``DIFF``'s unknown
handles are made distinct where they are read): a ``DISTINCT`` here sorted the whole report."""
START_REPORTED_TASKS = (
    "UPDATE reaper.tasks SET state = $2 WHERE worker = $1"
    " AND state = ANY($3::text[]) AND id " + IN_REPORT + " RETURNING id"
)
"""Rule 5: a placed task ($3, ``states.STARTING_TASKS``) becomes ``$2``
(``states.STARTED``) when its worker reports it."""
ORPHANED_TASKS = (
    "SELECT id FROM reaper.tasks WHERE worker = $1 AND state = ANY($2::text[]) AND id " + IN_REPORT
)
"""Rule 7: reported tasks that are over ($2, ``states.ENDED_TASKS``: reaped or stopped) are
orphans."""
ASSIGNMENTS = (
    "SELECT id FROM reaper.tasks WHERE worker = $1 AND state = ANY($2::text[])"
    " ORDER BY created_at, id"
)
"""Tasks placed on the worker and not started ($2, ``states.STARTING_TASKS``), for its agent
to start."""
COLLECTING = "SET LOCAL reaper.collecting = on"
"""The collector's transactions say so: their writes follow a diff already and are not fed
back into the change feed (``reaper.row_changes``, migration 007)."""
WORKER_FOR_SHARE = (
    "SELECT state, state_since, drained_at IS NOT NULL AS drained FROM reaper.workers"
    " WHERE name = $1 FOR SHARE"
)
FLEET_STATE = "SELECT state FROM reaper.fleet WHERE id = 1"
