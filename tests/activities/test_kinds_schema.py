"""The kinds table (``reaper.core.kinds``) and the schema the migrations build agree: every
kind has its table with its key, ``worker``, ``state`` and ``missing_since`` columns, a
trigger that feeds the change feed, a ``workers`` column for its last complete report, and
the checks on ``events.kind`` and
``row_changes.kind`` admit exactly the kinds (a kind added without its migration fails
here). Real Postgres, migrated."""

from __future__ import annotations

import re
from typing import get_args

import asyncpg

from reaper.core import kinds
from reaper.core.contract import Heartbeat, Kind


async def _check_values(pool: asyncpg.Pool, table: str, column: str) -> set[str]:
    """The values a ``CHECK (column IN (...))`` constraint of ``reaper.table`` admits."""
    defs = await pool.fetch(
        "SELECT pg_get_constraintdef(c.oid) AS d FROM pg_constraint c"
        " JOIN pg_class t ON t.oid = c.conrelid JOIN pg_namespace n ON n.oid = t.relnamespace"
        " WHERE n.nspname = 'reaper' AND t.relname = $1 AND c.contype = 'c'",
        table,
    )
    found = [d["d"] for d in defs if column in d["d"]]
    assert len(found) == 1, (table, column, [d["d"] for d in defs])
    return set(re.findall(r"'([a-z]+)'::text", found[0]))


async def test_every_kind_has_its_table_and_the_checks_admit_exactly_the_kinds(pool):
    for k in kinds.ALL:
        schema, table = k.table.split(".")
        columns = {
            r["column_name"]
            for r in await pool.fetch(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = $1 AND table_name = $2",
                schema,
                table,
            )
        }
        assert {k.key, "worker", "state", "missing_since"} <= columns, (k, columns)
        triggers = await pool.fetchval(
            "SELECT count(*) FROM information_schema.triggers"
            " WHERE event_object_schema = $1 AND event_object_table = $2",
            schema,
            table,
        )
        assert triggers >= 1, f"{k.table} feeds no change feed (migration 007's trigger)"
    workers = {
        r["column_name"]
        for r in await pool.fetch(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = 'reaper' AND table_name = 'workers'"
        )
    }
    assert {k.complete_column for k in kinds.ALL} <= workers, workers
    assert await _check_values(pool, "events", "kind") == {*kinds.WORDS, "worker"}
    assert await _check_values(pool, "row_changes", "kind") == set(kinds.REPORTS)


def test_every_kind_is_a_list_of_the_heartbeat():
    assert set(kinds.REPORTS) <= set(Heartbeat.model_fields)
    assert get_args(Kind) == kinds.REPORTS, "contract.Kind (the digests' keys) lists every kind"
    for k in kinds.ALL:
        assert kinds.kind(k.report) is k and kinds.kind(k.word) is k
