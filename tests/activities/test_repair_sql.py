"""The repair's SQL selects exactly the workers ``reaper.core.policy.repair.is_suspect``
calls suspect (activities/repair.py ``SUSPECTS``), on random rows against real Postgres.
Seeded, so a failure names a reproducible case."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from activities.repair import find_suspects
from reaper.core.policy.repair import retire_cutoff, suspect_after, suspect_cutoff
from tests.support.rule_models import is_suspect

NOW = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
TIMINGS = (1.0, 3.0, 6.0)  # heartbeat interval, STALL_AFTER, LOST_AFTER (seconds)
RETIRE_AFTER = 30.0
STATES = ["running", "stalled", "lost", "retired"]


async def test_suspects_sql_agrees_with_the_policy(pool):
    rng = random.Random(7)
    bound = suspect_after(*TIMINGS)
    rows = []
    lost_bound = (NOW - retire_cutoff(NOW, TIMINGS[0], RETIRE_AFTER)).total_seconds()
    for i in range(200):
        silent = rng.choice([None, 0.0, bound - 0.001, bound, bound + 0.001, rng.uniform(0, 60)])
        last = NOW - timedelta(seconds=silent) if silent is not None else None
        held = rng.choice([0.0, lost_bound - 0.001, lost_bound + 0.001, rng.uniform(0, 90)])
        rows.append((f"w{i}", rng.choice(STATES), last, NOW - timedelta(seconds=held)))
    await pool.executemany(
        "INSERT INTO reaper.workers (name, state, last_heartbeat_at, state_since)"
        " VALUES ($1, $2, $3, $4)",
        rows,
    )
    cutoff = suspect_cutoff(NOW, *TIMINGS)
    retire_by = retire_cutoff(NOW, TIMINGS[0], RETIRE_AFTER)
    selected = await find_suspects(pool, cutoff, len(rows), retire_by)
    expected = {
        name
        for name, state, last, since in rows
        if is_suspect(state, last, NOW, *TIMINGS, since, RETIRE_AFTER)
    }
    assert set(selected) == expected
    assert expected  # the draw holds suspects and non-suspects alike
    assert len(expected) < len(rows)

    assert any(state == "lost" for name, state, *_ in rows if name in expected)
    limited = await find_suspects(pool, cutoff, 3, retire_by)
    assert len(limited) == 3 and set(limited) <= expected
