"""``workers.<kind>_complete_at``: written by ``record_worker_state`` and
``refresh_heartbeat`` with the heartbeat they write, never moved backwards, and left alone
by inputs of older controllers (no ``complete_at``), against real Postgres (issue 35)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg

from activities import ReaperActivities
from activities.types import HeartbeatRefresh, WorkerStateChange
from reaper.core.contract import WorkerState
from tests.support.controller import make_settings

T0 = datetime(2026, 12, 7, 14, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def _row(pool: asyncpg.Pool, worker: str) -> tuple[datetime | None, ...]:
    r = await pool.fetchrow(
        "SELECT last_heartbeat_at, containers_complete_at, volumes_complete_at,"
        " tasks_complete_at FROM reaper.workers WHERE name = $1",
        worker,
    )
    return tuple(r.values())


async def test_complete_report_times_follow_the_liveness_and_never_go_back(
    pool: asyncpg.Pool,
) -> None:
    acts = ReaperActivities(pool, make_settings())
    every = {"containers": at(0), "volumes": at(0), "tasks": at(0)}
    # Registration: the first beat was complete.
    await acts.record_worker_state(
        WorkerStateChange(
            worker="w1",
            state=WorkerState.running,
            at=at(0),
            boot_id="b1",
            last_seq=0,
            last_heartbeat_at=at(0),
            complete_at=every,
        )
    )
    assert await _row(pool, "w1") == (at(0), at(0), at(0), at(0))

    # Later beats carry containers and tasks only (volumes could not be listed).
    refresh = HeartbeatRefresh(
        worker="w1",
        boot_id="b1",
        last_seq=20,
        last_heartbeat_at=at(20),
        complete_at={**every, "containers": at(20), "tasks": at(20)},
    )
    assert await acts.refresh_heartbeat(refresh)
    assert await _row(pool, "w1") == (at(20), at(20), at(0), at(20))
    assert not await acts.refresh_heartbeat(refresh)  # a retry changes nothing

    # A late or older input never moves a time back.
    older = HeartbeatRefresh(
        worker="w1",
        boot_id="b1",
        last_seq=30,
        last_heartbeat_at=at(30),
        complete_at={"containers": at(5)},
    )
    assert await acts.refresh_heartbeat(older)
    assert await _row(pool, "w1") == (at(30), at(20), at(0), at(20))

    # An older controller's input has no complete_at: it writes the beat only.
    legacy = HeartbeatRefresh.model_validate(
        {"worker": "w1", "boot_id": "b1", "last_seq": 40, "last_heartbeat_at": at(40)}
    )
    assert await acts.refresh_heartbeat(legacy)
    assert await _row(pool, "w1") == (at(40), at(20), at(0), at(20))

    # A state record carries them too (a stall, then a return with complete reports).
    for state, t in ((WorkerState.stalled, 60), (WorkerState.running, 70)):
        await acts.record_worker_state(
            WorkerStateChange(
                worker="w1",
                state=state,
                at=at(t),
                boot_id="b1",
                last_seq=50,
                last_heartbeat_at=at(t),
                complete_at={**every, "volumes": at(t)} if t == 70 else {},
            )
        )
    assert await _row(pool, "w1") == (at(70), at(20), at(70), at(20))
