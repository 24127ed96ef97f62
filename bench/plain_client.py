"""A plain signal-with-start client: heartbeats sent through the contract alone (CONTRACT.md
§2), with none of the bench's own load generator (no ``SimAgent``, no ``build_beats``, no
warm-up unless asked), to reaper's ``WorkerLiveness`` and to the no-op workflow alike.

``N`` workers x ``M`` beats, each beat ``client.start_workflow(type, input, id=...,
start_signal="heartbeat", start_signal_args=[beat])``. Each factor the bench's metric 1 fixes
is a knob here (:class:`Case`): the in-flight limit (none by default), the order (each
worker's beats one after another, or round-robin over the workers as the bench sends), a
warm-up (none by default: a new id's first beat is its registration, timed with the rest),
the reports (none, on every beat or on every other, of ``handles`` containers), and whether
their handles are rows in the controller's database (unchanged reports of known handles, as
the bench inserts them) or not (what a client of the contract alone can send).

Two clocks per burst from the first send: **sent** (the last signal-with-start answered)
and **handled** (every beat in the workflow's state: reaper's ``state`` ``last_seq``, polled
once the sends are answered; the no-op's worker counter). Cases: ``python -m bench.plain_why``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError

from reaper.core.contract import HEARTBEAT_SIGNAL, LIVENESS_WORKFLOW, STATE_QUERY, liveness_id

NOOP_WORKFLOW = "BenchNoop"


@dataclass(frozen=True)
class Case:
    """How a plain client sends one burst.

    Args:
        workers: workflows beaten (new ids each burst).
        beats: beats per worker that are timed (a cold burst's first is the registration).
        in_flight: signal-with-starts awaited at once at most; ``0``: no limit (every
            worker's beats go as fast as ``order`` lets them).
        order: ``"worker"``: each worker sends its beats one after another, the next once
            the last was answered (an agent's way); ``"round"``: beat ``b`` of every worker
            before beat ``b + 1`` of any, as one queue (the bench's metric 1).
        warm: before the timed beats, one beat per worker (its registration, with its first
            report unless ``report`` is ``"none"``), waited for until handled, then
            ``settle`` seconds of quiet (the first report reconciled).
        report: ``"none"`` (liveness only), ``"every"`` or ``"alt"`` (every other beat, the
            odd ones, as the bench): the beats carrying a complete, unchanged report.
        handles: containers in each report.
        kinds: ``1``: a report is ``containers`` alone; ``3``: with ``volumes`` and ``tasks``
            empty lists too (the bench's ``SimAgent`` reports all three kinds).
        known: the reported handles are rows of the controller's database (state
            ``created``), as the bench inserts them; otherwise unknown to it.
        settle: seconds slept after a warm-up (the bench sleeps 2 heartbeat intervals).
        reuse: every repetition beats the same workflows, their seq going on (the bench's
            rounds do): from the second on, long-warm workflows; otherwise new ones each time.
        noop_query: the no-op's beats are known handled by its ``last_seq`` query, polled as
            reaper's ``state`` (the bench's rounds), not by its worker's counter.
    """

    workers: int = 100
    beats: int = 20
    in_flight: int = 0
    order: str = "worker"
    warm: bool = False
    report: str = "every"
    handles: int = 5
    kinds: int = 1
    known: bool = False
    settle: float = 0.0
    reuse: bool = False
    noop_query: bool = False

    def label(self) -> str:
        """One line naming every knob, e.g. ``100x20 worker in-flight 0 cold every/5``."""
        return (
            f"{self.workers}x{self.beats} {self.order} in-flight {self.in_flight or 'none'} "
            f"{'warm' if self.warm else 'cold'} {self.report}/{self.handles}"
            f"{' 3 kinds' if self.kinds == 3 else ''}{' known' if self.known else ''}"
            f"{' reused' if self.reuse else ''}"
            f"{' no-op-queried' if self.noop_query else ''}"
        )

    def with_(self, **changes: Any) -> Case:
        """A copy with ``changes`` (field names as above)."""
        return replace(self, **changes)


@dataclass
class Side:
    """One side of the comparison: where its beats go and how to read its worker.

    Args:
        name: ``"reaper"`` or ``"no-op"``.
        task_queue: its worker's task queue.
        cpu: its worker process's CPU seconds so far (user + system).
        handled: for the no-op, its worker's count of handled signals so far; ``None``:
            reaper, read through the ``state`` query.
    """

    name: str
    task_queue: str
    cpu: Callable[[], float]
    handled: Callable[[], Awaitable[float]] | None = None

    @property
    def is_reaper(self) -> bool:
        return self.handled is None

    def workflow_id(self, worker: str) -> str:
        return liveness_id(worker) if self.is_reaper else f"{NOOP_WORKFLOW}-{worker}"


@dataclass
class Burst:
    """One burst's clocks: seconds from the first send until the last signal-with-start was
    answered (``sent_s``) and until every beat was handled (``handled_s``); the side's
    worker's CPU seconds over the handled window (``cpu_s``); beats timed (``beats``)."""

    side: str
    beats: int
    sent_s: float
    handled_s: float
    cpu_s: float
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def sent_rate(self) -> float:
        """Beats per second by the send clock."""
        return self.beats / self.sent_s

    @property
    def handled_rate(self) -> float:
        """Beats per second by the handled clock."""
        return self.beats / self.handled_s

    @property
    def cpu_ms(self) -> float:
        """Worker CPU milliseconds per timed beat."""
        return self.cpu_s / self.beats * 1000


def beat(worker: str, boot_id: str, seq: int, handles: list[str] | None) -> dict[str, Any]:
    """One heartbeat as CONTRACT.md §2 writes it: ``containers`` the complete list when
    ``handles`` is given (liveness only when ``None``)."""
    b: dict[str, Any] = {
        "worker": worker,
        "boot_id": boot_id,
        "seq": seq,
        "sent_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
    }
    if handles is not None:
        b["containers"] = handles
    return b


def handles_of(worker: str, n: int) -> list[str]:
    """The ``n`` container handles ``worker`` reports."""
    return [f"{worker}-c{j}" for j in range(n)]


async def _send(client: Client, side: Side, payload: dict[str, Any]) -> None:
    w = payload["worker"]
    await client.start_workflow(
        LIVENESS_WORKFLOW if side.is_reaper else NOOP_WORKFLOW,
        {"worker": w} if side.is_reaper else None,
        id=side.workflow_id(w),
        task_queue=side.task_queue,
        start_signal=HEARTBEAT_SIGNAL,
        start_signal_args=[payload],
    )


async def _seq(client: Client, side: Side, worker: str) -> int:
    h = client.get_workflow_handle(side.workflow_id(worker))
    try:
        raw = await h.query(STATE_QUERY if side.is_reaper else "last_seq")
    except RPCError:
        return -1
    seq = raw.get("last_seq") if isinstance(raw, dict) else raw
    return seq if isinstance(seq, int) else -1


async def forwarded(client: Client, side: Side, names: list[str]) -> int:
    """reaper: the complete reports (one per kind) its livenesses of ``names`` handed to
    their collectors so far (``state`` ``forwarded_reports``, summed); 0 for the no-op."""
    if not side.is_reaper:
        return 0
    sem = asyncio.Semaphore(32)

    async def one(w: str) -> int:
        async with sem:
            try:
                raw = await client.get_workflow_handle(liveness_id(w)).query(STATE_QUERY)
            except RPCError:
                return 0
        n = raw.get("forwarded_reports") if isinstance(raw, dict) else None
        return n if isinstance(n, int) else 0

    return sum(await asyncio.gather(*(one(w) for w in names)))


async def wait_handled(
    client: Client,
    side: Side,
    want: dict[str, int],
    base: float,
    query: bool = False,
    timeout: float = 300,
) -> None:
    """Until every worker's beat ``want[worker]`` is handled: reaper's ``state`` queries
    (at most 32 at once, every 20 ms, only the workers not yet there); the no-op's counter
    reaching ``base``, or with ``query`` its ``last_seq`` queries as reaper's. Raises
    TimeoutError."""
    start = time.monotonic()
    left = dict(want)
    sem = asyncio.Semaphore(32)

    async def seq(w: str) -> int:
        async with sem:
            return await _seq(client, side, w)

    while True:
        if side.is_reaper or query:
            names = list(left)
            for w, s in zip(names, await asyncio.gather(*(seq(w) for w in names)), strict=True):
                if s >= left[w]:
                    left.pop(w)
            if not left:
                return
        elif side.handled is not None and await side.handled() >= base:
            return
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{side.name}: beats not handled in {timeout:g}s")
        await asyncio.sleep(0.02)


async def burst(
    client: Client,
    side: Side,
    case: Case,
    prefix: str,
    first_seq: int = 0,
    boot: str = "boot-plain",
) -> Burst:
    """Send ``case`` to ``side`` on workflows ``{prefix}-NNNN``, new ones unless
    ``first_seq`` > 0 (then those of an earlier burst, whose beats went up to
    ``first_seq`` - 1, and no warm-up); its clocks. The payloads depend on ``case`` only,
    not on the side."""
    names = [f"{prefix}-{i:04d}" for i in range(case.workers)]
    lists = {w: handles_of(w, case.handles) for w in names}

    def payload(w: str, seq: int, warm_up: bool = False) -> dict[str, Any]:
        with_report = case.report == "every" or (case.report == "alt" and seq % 2 == 1)
        with_report = with_report or (warm_up and case.report != "none")
        b = beat(w, boot, seq, lists[w] if with_report else None)
        if with_report and case.kinds == 3:
            b.update(volumes=[], tasks=[])
        return b

    first = first_seq
    if case.warm and not first_seq:
        base = await side.handled() if side.handled else 0.0
        await asyncio.gather(*(_send(client, side, payload(w, 0, True)) for w in names))
        await wait_handled(client, side, dict.fromkeys(names, 0), base + len(names))
        await asyncio.sleep(case.settle)
        first = 1
    seqs = range(first, first + case.beats)
    base = (await side.handled() if side.handled else 0.0) + case.workers * case.beats
    sem = asyncio.Semaphore(case.in_flight) if case.in_flight else None

    async def one(w: str, s: int) -> None:
        if sem is None:
            await _send(client, side, payload(w, s))
            return
        async with sem:
            await _send(client, side, payload(w, s))

    async def agent(w: str) -> None:
        for s in seqs:
            await one(w, s)

    f0 = await forwarded(client, side, names) if first else 0
    c0 = side.cpu()
    start = time.monotonic()
    if case.order == "worker":
        await asyncio.gather(*(agent(w) for w in names))
    else:
        await asyncio.gather(*(one(w, s) for s in seqs for w in names))
    sent = time.monotonic() - start
    await wait_handled(client, side, dict.fromkeys(names, seqs[-1]), base, case.noop_query)
    handled = time.monotonic() - start
    cpu = side.cpu() - c0
    fwd = await forwarded(client, side, names) - f0
    n = case.workers * case.beats
    return Burst(side.name, n, sent, handled, cpu, {"forwarded": fwd})
