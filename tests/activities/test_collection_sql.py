"""The collection SQL and the collection policy agree, on random rows against real Postgres.

``reconcile_report`` and ``destroy_missing`` apply ``reaper.core.policy.collection`` set-wise
(``activities/collection_sql.py``). Here every random row's fate under the SQL is compared
with the pure functions' verdict: ``report_decides`` and ``row_verdict`` for a reconcile,
``may_destroy`` for a destroy. Seeded, so a failure names a reproducible case.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg

from activities import ReaperActivities
from activities.types import DestroyInput, ReconcileInput
from reaper.core.config import Settings
from reaper.core.contract import WorkerState
from reaper.core.policy.collection import report_decides
from tests.support.rule_models import RowVerdict, may_destroy, row_verdict

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
from tests.support.sealed import sealed  # noqa: E402

TTL = 300.0
CASES = 120
KIND_STATES = {
    "containers": ["creating", "created", "destroying"],
    "volumes": ["creating", "created", "destroying"],
    "tasks": ["pending", "running", "lost", "stopped"],
}
TABLE_KEY = {
    "containers": ("reaper.containers", "handle"),
    "volumes": ("reaper.volumes", "handle"),
    "tasks": ("reaper.tasks", "id"),
}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@dataclass
class Row:
    handle: str
    state: str
    changed: datetime
    missing_since: datetime | None
    in_report: bool


@dataclass
class Case:
    worker: str
    kind: str
    worker_state: str
    state_since: datetime
    taken_at: datetime
    fleet_full: bool
    rows: list[Row]


def draw_case(rng: random.Random, n: int) -> Case:
    kind = rng.choice(list(KIND_STATES))
    worker = f"w{n}"
    rows = []
    for i in range(rng.randint(1, 6)):
        marked = rng.random() < 0.4
        rows.append(
            Row(
                handle=f"{worker}-{kind[0]}{i}",
                state=rng.choice(KIND_STATES[kind]),
                changed=at(rng.choice([0, 50, 100, 150, 200])),
                missing_since=at(rng.choice([-400, -300, -100, 0, 50])) if marked else None,
                in_report=rng.random() < 0.5,
            )
        )
    return Case(
        worker=worker,
        kind=kind,
        worker_state=rng.choice(["running"] * 3 + ["stalled", "lost"]),
        state_since=at(rng.choice([-1000, 0, 100, 200])),
        taken_at=at(rng.choice([100, 150, 300])),
        fleet_full=rng.random() < 0.15,
        rows=rows,
    )


async def load(pool: asyncpg.Pool, cases: list[Case]) -> None:
    """Write the workers and their rows as a scheduler and an earlier reconcile left them."""
    async with pool.acquire() as conn:
        # The trigger stamps state_changed_at on insert from the value given.
        for c in cases:
            await conn.execute(
                "INSERT INTO reaper.workers (name, state, state_since) VALUES ($1, $2, $3)",
                c.worker,
                c.worker_state,
                c.state_since,
            )
            table, key = TABLE_KEY[c.kind]
            await conn.executemany(
                f"INSERT INTO {table} ({key}, worker, state, state_changed_at, missing_since)"
                " VALUES ($1, $2, $3, $4, $5)",
                [(r.handle, c.worker, r.state, r.changed, r.missing_since) for r in c.rows],
            )


async def marks(pool: asyncpg.Pool, case: Case) -> dict[str, datetime | None]:
    table, key = TABLE_KEY[case.kind]
    rows = await pool.fetch(
        f"SELECT {key} AS h, missing_since FROM {table} WHERE worker = $1", case.worker
    )
    return {r["h"]: r["missing_since"] for r in rows}


async def test_reconcile_sql_agrees_with_row_verdict(pool: asyncpg.Pool) -> None:
    rng = random.Random(20261201)
    cases = [draw_case(rng, n) for n in range(CASES)]
    await load(pool, cases)
    acts = ReaperActivities(pool, Settings(_env_file=None))
    checked = 0
    for c in cases:
        await acts.reconcile_report(
            ReconcileInput(
                worker=c.worker,
                kind=c.kind,
                handles=[r.handle for r in c.rows if r.in_report],
                taken_at=c.taken_at,
                missing_ttl=TTL,
                creating_timeout=10**7,
                confirmed=True,
                report=sealed(
                    c.worker, c.kind, [r.handle for r in c.rows if r.in_report], c.taken_at
                ),
            )
        )
        after = await marks(pool, c)
        decides = report_decides(c.worker_state, c.state_since, c.taken_at) is None
        for r in c.rows:
            verdict = (
                row_verdict(
                    c.kind, r.state, r.changed, r.missing_since is not None, r.in_report, c.taken_at
                )
                if decides
                else RowVerdict.keep
            )
            expected = {
                RowVerdict.mark: c.taken_at,
                RowVerdict.clear: None,
                RowVerdict.keep: r.missing_since,
            }[verdict]
            assert after[r.handle] == expected, (c, r, verdict)
            checked += 1
    assert checked > 2 * CASES  # the draw really exercised rows


async def test_destroy_sql_agrees_with_may_destroy(pool: asyncpg.Pool) -> None:
    rng = random.Random(1202)
    cases = [draw_case(rng, n) for n in range(CASES)]
    await load(pool, cases)
    acts = ReaperActivities(pool, Settings(_env_file=None))
    destroyed_any = kept_any = False
    for c in cases:
        await pool.execute(
            "UPDATE reaper.fleet SET state = $1 WHERE id = 1", "full" if c.fleet_full else "normal"
        )
        await acts.destroy_missing(
            DestroyInput(
                worker=c.worker,
                kind=c.kind,
                cutoff=c.taken_at - timedelta(seconds=TTL),
                missing_ttl=TTL,
                report=sealed(c.worker, c.kind, [], c.taken_at),
            )
        )
        after = await marks(pool, c)
        table, key = TABLE_KEY[c.kind]
        for r in c.rows:
            expected = may_destroy(
                c.kind,
                r.state,
                r.missing_since,
                c.taken_at,
                TTL,
                WorkerState(c.worker_state),
                c.fleet_full,
            )
            if c.kind == "tasks":
                state = await pool.fetchval(f"SELECT state FROM {table} WHERE {key} = $1", r.handle)
                gone = state == "stopped" and r.state != "stopped"
            else:
                gone = r.handle not in after
            assert gone is expected, (c, r)
            destroyed_any |= expected
            kept_any |= not expected
    assert destroyed_any and kept_any
