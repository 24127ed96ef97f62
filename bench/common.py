"""Helpers shared by the bench's phases: queries, settling, bounded concurrency."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client
from temporalio.service import RPCError

from reaper.kit.agents import query_state
from workflows.common import collector_id

T = TypeVar("T")

Progress = Callable[[str], None]
"""How a phase reports progress: one line of text (``Run.progress``)."""


async def gather_limited(coros: Iterable[Awaitable[T]], limit: int = 32) -> list[T]:
    """Await all of ``coros`` with at most ``limit`` running at once; results in order."""
    sem = asyncio.Semaphore(limit)

    async def one(c: Awaitable[T]) -> T:
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


async def wait_until(
    check: Callable[[], Awaitable[bool]], timeout: float, what: str, poll: float = 0.1
) -> float:
    """Poll ``check`` until true; returns the seconds waited. Raises TimeoutError."""
    start = time.monotonic()
    while True:
        if await check():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(poll)


async def settled(client: Client, worker: str, last_seq: int) -> bool:
    """The liveness has seen beat ``last_seq`` and its collector reconciled every report it
    was handed (the same test as tests/support/fleet.py)."""
    try:
        st = await query_state(client, worker)
    except RPCError:
        return False
    if st.last_seq is None or st.last_seq < last_seq or st.pending_reports:
        return False
    if not st.forwarded_reports:
        return True
    h = client.get_workflow_handle(collector_id(worker))
    try:
        processed = await h.query("processed", result_type=int)
        backlog = await h.query("backlog", result_type=int)
    except RPCError:
        return False
    return processed == st.forwarded_reports and backlog == 0


async def wait_settled(client: Client, last_seq: dict[str, int], timeout: float) -> float:
    """Wait until every worker in ``last_seq`` is :func:`settled`; seconds waited."""
    left = dict(last_seq)

    async def check() -> bool:
        names = list(left)
        done = await gather_limited((settled(client, n, left[n]) for n in names), 32)
        for n, ok in zip(names, done, strict=True):
            if ok:
                left.pop(n)
        return not left

    return await wait_until(check, timeout, f"{len(left)} workers settled", poll=0.2)


async def forwarded(client: Client, workers: Iterable[str]) -> int:
    """Complete reports (one per kind) handed to collectors so far, summed over ``workers``."""
    views = await gather_limited((query_state(client, w) for w in workers), 32)
    return sum(v.forwarded_reports for v in views)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def scrape(port: int, timeout: float = 10.0) -> str:
    """The Prometheus text of ``http://127.0.0.1:{port}/metrics``. Raises ``OSError``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as resp:
        return str(resp.read().decode())


def sample_sum(text: str, name: str) -> float:
    """The sum over every label set of the samples named ``name`` in Prometheus text."""
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    )
