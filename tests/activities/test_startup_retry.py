"""CONTRACT.md §1: the controller waits for Postgres and Temporal with a bounded retry, then
exits with one clear line (``Unreachable``, printed by ``worker.main``). Here against ports
where nothing listens, with a deadline of about a second instead of two minutes."""

from __future__ import annotations

import socket
import time

import asyncpg
import pytest
from temporalio.service import RPCError, RPCStatusCode

from reaper.infra.db import Unreachable, create_pool, postgres_unavailable, with_backoff
from reaper.infra.temporal import connect, temporal_unavailable, while_unavailable


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_postgres_unreachable_ends_in_one_clear_error_after_the_deadline() -> None:
    url = f"postgresql://reaper@127.0.0.1:{closed_port()}/reaper"
    start = time.monotonic()
    with pytest.raises(Unreachable, match=r"^Postgres unreachable after 1s: "):
        await create_pool(url, deadline_s=1)
    assert time.monotonic() - start < 10  # bounded: it gave up, it did not hang


async def test_temporal_unreachable_ends_in_one_clear_error_after_the_deadline() -> None:
    address = f"127.0.0.1:{closed_port()}"
    with pytest.raises(Unreachable, match=rf"^Temporal at {address} unreachable after 1s: "):
        await connect(address, "default", deadline_s=1)


async def test_a_start_up_step_cut_off_by_postgres_is_retried_and_a_bad_one_is_not(pool) -> None:
    """A replica's start-up step (migrations, the secret) whose connection Postgres closes
    mid-statement runs again (a replica restarted while Postgres stopped exited on it: chaos
    smoke, 2026-12-05); an error of the statement itself is raised at once."""
    calls = 0

    async def step() -> int:
        nonlocal calls
        calls += 1
        async with pool.acquire() as conn:
            if calls == 1:  # the server ends this session, as a fast shutdown does
                await conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            return int(await conn.fetchval("SELECT 1"))

    assert await with_backoff(step, postgres_unavailable, "Postgres", deadline_s=10) == 1
    assert calls == 2
    with pytest.raises(asyncpg.PostgresSyntaxError):
        await with_backoff(
            lambda: pool.execute("SELEC 1"), postgres_unavailable, "Postgres", deadline_s=10
        )


async def test_a_start_up_call_cut_off_by_a_lost_connection_is_retried_and_a_refusal_is_not():
    """A start-up call to Temporal (the search attributes, the fleet monitor's start) that the
    client answers with "transport error" (a connection lost under the call) runs again; a
    refusal of the server's (here INVALID_ARGUMENT) is raised at once."""
    lost = RPCError("transport error", RPCStatusCode.UNKNOWN, b"")
    answers: list[BaseException | str] = [lost, lost, "registered"]

    async def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    assert await while_unavailable(call, "a test call", deadline_s=30) == "registered"
    assert answers == []
    assert temporal_unavailable(RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b""))
    assert not temporal_unavailable(RPCError("some other", RPCStatusCode.UNKNOWN, b""))
    refused = RPCError("bad attribute", RPCStatusCode.INVALID_ARGUMENT, b"")

    async def bad() -> str:
        raise refused

    with pytest.raises(RPCError) as err:
        await while_unavailable(bad, "a bad call", deadline_s=30)
    assert err.value is refused
