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
from reaper.core.states import MARKABLE

__all__ = ["MARKABLE"]

REPORT = "pg_temp.reaper_report"
"""The report being reconciled: a temporary table of the connection, emptied at commit.

The report is sent to Postgres once (COPY, or straight from ``reaper.report_chunks`` when it
was staged) and every statement joins against it; shipping a 100,000-handle array to each
statement cost four times the transfer and parse (BENCHMARKS.md, metric 3a)."""
CREATE_REPORT = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {REPORT.split('.')[1]} (h text NOT NULL)"
    " ON COMMIT DELETE ROWS"
)
IN_REPORT = f"IN (SELECT h FROM {REPORT})"

# Rows of the worker absent from the report, markable, whose state was set before the
# report was taken (rule 2). $2 taken_at, $3 markable states.
ABSENT = (
    "FROM {table} t WHERE t.worker = $1 AND t.state = ANY($3::text[])"
    " AND t.state_changed_at <= $2"
    f" AND NOT EXISTS (SELECT 1 FROM {REPORT} r WHERE r.h = t.{{key}})"
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
        "UPDATE {table} AS u SET missing_since = $2 FROM (SELECT t.{key} AS k "
        + ABSENT
        + " AND t.missing_since IS NULL) AS m WHERE u.{key} = m.k RETURNING u.{key}"
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
        " SELECT $1, '{kind}', t.{key}, $2 " + ABSENT + " ON CONFLICT DO NOTHING RETURNING handle"
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
    f"WITH u AS (SELECT r.h FROM {REPORT} r"
    "  WHERE NOT EXISTS (SELECT 1 FROM {table} t WHERE t.{key} = r.h AND t.worker = $1)),"
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
REMOVE_MISSING = {
    kind: (
        f"DELETE FROM {table} WHERE worker = $1 AND missing_since IS NOT NULL"
        " AND missing_since <= $2 AND state = ANY($3::text[])"
        " RETURNING handle, NULL::text AS service, missing_since"
    )
    for kind, table in (("containers", "reaper.containers"), ("volumes", "reaper.volumes"))
}
REMOVE_MISSING["tasks"] = (
    "UPDATE reaper.tasks SET state = $4, stop_reason = 'missing', missing_since = NULL"
    " WHERE worker = $1 AND missing_since IS NOT NULL AND missing_since <= $2"
    " AND state = ANY($3::text[]) RETURNING id AS handle, service, $2::timestamptz AS missing_since"
)
"""$4: what a destroy makes of a task (``reaper.core.states.DESTROYED``)."""
WOULD_REMOVE_MISSING = {
    kind: sql.replace("{service}", "t.service" if kind == "tasks" else "NULL::text")
    for kind, sql in dry_marks_per_kind(
        "UPDATE reaper.dry_marks d SET done = true FROM {table} t"
        " WHERE d.worker = $1 AND d.kind = '{kind}' AND NOT d.done AND d.missing_since <= $2"
        " AND t.{key} = d.handle AND t.worker = $1 AND t.state = ANY($3::text[])"
        " RETURNING d.handle, {service} AS service, d.missing_since"
    ).items()
}
# Rows still being created ($3, ``states.BEING_CREATED``) since $2 or earlier: their creator
# crashed (CREATING_TIMEOUT).
FAIL_STUCK_CREATING = {
    kind: (
        f"DELETE FROM {table} WHERE worker = $1 AND state = ANY($3::text[])"
        " AND state_changed_at <= $2 RETURNING handle"
    )
    for kind, table in (("containers", "reaper.containers"), ("volumes", "reaper.volumes"))
}
CREATING = {
    kind: (
        "SELECT min(state_changed_at) FILTER (WHERE state_changed_at > $3) AS upcoming,"
        " count(*) FILTER (WHERE state_changed_at <= $3) AS overdue"
        f" FROM {table} WHERE worker = $1 AND state = ANY($2::text[])"
    )
    for kind, table in (("containers", "reaper.containers"), ("volumes", "reaper.volumes"))
}
"""The worker's rows still being created ($2): when the oldest one not yet timed out at the
cutoff $3 entered that state (it times out ``CREATING_TIMEOUT`` later,
``policy.collection.creating_due``), and how many are past it and still there (held by a
full disruption)."""
WOULD_FAIL_STUCK_CREATING = {
    kind: (
        f"SELECT handle FROM {table} WHERE worker = $1 AND state = ANY($3::text[])"
        " AND state_changed_at <= $2"
    )
    for kind, table in (("containers", "reaper.containers"), ("volumes", "reaper.volumes"))
}


LOAD_STAGED = (
    "WITH c AS (SELECT handles FROM reaper.report_chunks WHERE worker = $1"
    " AND kind = $2 AND report_id = $3),"
    f" ins AS (INSERT INTO {REPORT} (h) SELECT DISTINCT unnest(handles) FROM c)"
    " SELECT count(*) FROM c"
)
"""Copy a staged report into ``REPORT`` inside Postgres; returns the chunks found."""
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
WORKER_FOR_SHARE = "SELECT state, state_since FROM reaper.workers WHERE name = $1 FOR SHARE"
FLEET_STATE = "SELECT state FROM reaper.fleet WHERE id = 1"
