"""``python -m bench.plain_why``: the plain client's cases (bench/plain_client.py) against
reaper and the no-op, on a stack of its own (dev server, Postgres, one controller with
metric 1's timings, the no-op worker), to find why a plain client and the bench's metric 1
disagree. Each case is a set of knobs; one factor varied per case against a base::

    python -m bench.plain_why --reps 3 --case base --case in_flight=64 --case warm=1

Rounds: every repetition runs every case, the no-op first on even repetitions and reaper
first on odd ones, on new workflow ids each time (the same ones with ``reuse=1``). Printed
per case: the handled and sent ratios (reaper's rate / the no-op's rate of the same
repetition: median, min-max), the rates, CPU per beat of the controller and of the no-op
worker, the reports reaper forwarded to collectors while timed, and the load average. Give
the controller ``--setting REAPER_STALL_AFTER=3600s`` (and a longer LOST_AFTER): with
metric 1's 60 s, an earlier burst's silent workers are judged stalled during later ones and
reused ones return from stalled.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, fields

import asyncpg
from temporalio.client import Client

from bench.env import BenchEnv, Controller, NoopWorker
from bench.plain_client import Burst, Case, Side, burst, handles_of


def spread(xs: list[float]) -> str:
    """``median (min-max)`` of ``xs`` with two decimals."""
    s = sorted(xs)
    mid = s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2
    return f"{mid:.2f} ({s[0]:.2f}-{s[-1]:.2f})"


@dataclass
class CaseResult:
    """A case's bursts, reaper's and the no-op's, one pair per repetition (``pairs``)."""

    case: Case
    pairs: list[tuple[Burst, Burst]]
    loads: list[float]

    def ratios(self, clock: Callable[[Burst], float]) -> list[float]:
        """reaper / no-op of ``clock`` (a rate) per repetition."""
        return [clock(r) / clock(n) for r, n in self.pairs]

    def rate(self, i: int, clock: Callable[[Burst], float]) -> float:
        """Side ``i``'s (0 reaper, 1 the no-op) beats over its seconds by ``clock``
        (``lambda b: b.handled_s`` or ``b.sent_s``), all repetitions together."""
        return sum(p[i].beats for p in self.pairs) / sum(clock(p[i]) for p in self.pairs)

    def summary(self) -> str:
        """``handled R vs N/s = X, sent ... = Y; CPU per beat A vs B ms = Zx``."""
        hr, hn = self.rate(0, lambda b: b.handled_s), self.rate(1, lambda b: b.handled_s)
        sr, sn = self.rate(0, lambda b: b.sent_s), self.rate(1, lambda b: b.sent_s)
        cr = sum(p[0].cpu_s for p in self.pairs) / sum(p[0].beats for p in self.pairs) * 1000
        cn = sum(p[1].cpu_s for p in self.pairs) / sum(p[1].beats for p in self.pairs) * 1000
        return (
            f"handled {hr:.0f} vs {hn:.0f}/s = {hr / hn:.2f}, sent {sr:.0f} vs {sn:.0f}/s = "
            f"{sr / sn:.2f}; CPU per beat: controller {cr:.2f} ms vs no-op worker {cn:.2f} ms"
            f" = {cr / cn:.2f}x; {sum(p[0].extra.get('forwarded', 0) for p in self.pairs):.0f}"
            " complete reports forwarded to collectors (reconciled) while timed"
        )

    def lines(self) -> list[str]:
        """The case's summary, one line per clock and one for CPU."""
        hr = self.ratios(lambda b: b.handled_rate)
        sr = self.ratios(lambda b: b.sent_rate)
        cpu = [r.cpu_ms / n.cpu_ms for r, n in self.pairs]

        def rates(i: int, clock: Callable[[Burst], float]) -> str:
            return ", ".join(f"{clock(p[i]):.0f}" for p in self.pairs)

        return [
            f"{self.case.label()}: handled ratio {spread(hr)}; sent ratio {spread(sr)}; "
            f"load {min(self.loads):.1f}-{max(self.loads):.1f}; reports forwarded "
            + ", ".join(f"{r.extra.get('forwarded', 0):.0f}" for r, _ in self.pairs),
            f"  handled/s reaper {rates(0, lambda b: b.handled_rate)} vs no-op "
            f"{rates(1, lambda b: b.handled_rate)}; sent/s reaper "
            f"{rates(0, lambda b: b.sent_rate)} vs no-op {rates(1, lambda b: b.sent_rate)}",
            "  CPU per beat: controller "
            + ", ".join(f"{r.cpu_ms:.2f}" for r, _ in self.pairs)
            + " ms vs no-op worker "
            + ", ".join(f"{n.cpu_ms:.2f}" for _, n in self.pairs)
            + f" ms = {spread(cpu)}x",
        ]


async def known_rows(db_url: str, case: Case, prefix: str) -> None:
    """The handles ``case`` reports on workers ``{prefix}-NNNN``, as rows (state
    ``created``) of the controller's ``reaper.containers``: its reports are unchanged."""
    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=1)
    try:
        names = [f"{prefix}-{i:04d}" for i in range(case.workers)]
        await pool.copy_records_to_table(
            "containers",
            schema_name="reaper",
            columns=["handle", "worker", "state"],
            records=[(h, w, "created") for w in names for h in handles_of(w, case.handles)],
        )
    finally:
        await pool.close()


async def compare(
    client: Client,
    reaper: Side,
    noop: Side,
    cases: list[Case],
    reps: int,
    db_url: str,
    progress: Callable[[str], None] = print,
) -> list[CaseResult]:
    """Every case ``reps`` times against both sides (see the module); one result per case."""
    results = [CaseResult(c, [], []) for c in cases]
    for rep in range(reps):
        for res in results:
            tag = f"c{results.index(res)}" if res.case.reuse else uuid.uuid4().hex[:4]
            first = rep * (res.case.beats + res.case.warm) if res.case.reuse else 0
            got: dict[str, Burst] = {}
            for side in (noop, reaper) if rep % 2 == 0 else (reaper, noop):
                prefix = f"pl{tag}-{'r' if side.is_reaper else 'n'}"
                if side.is_reaper and res.case.known and not first:
                    await known_rows(db_url, res.case, prefix)
                got[side.name] = await burst(client, side, res.case, prefix, first)
                await asyncio.sleep(0.5)
            res.pairs.append((got[reaper.name], got[noop.name]))
            res.loads.append(os.getloadavg()[0])
            r, n = res.pairs[-1]
            progress(
                f"rep {rep} {res.case.label()}: handled {r.handled_rate:.0f} vs "
                f"{n.handled_rate:.0f}/s, sent {r.sent_rate:.0f} vs {n.sent_rate:.0f}/s, "
                f"CPU {r.cpu_ms:.2f} vs {n.cpu_ms:.2f} ms, "
                f"{r.extra['forwarded']:.0f} reports forwarded"
            )
    return results


PLAIN = Case(in_flight=0, order="worker", warm=False, report="every", known=False)
"""The plain client of issue 36: each worker's beats one after another by signal-with-start,
no other in-flight limit, no warm-up (the first beat registers), every beat an unchanged
report of handles unknown to the controller (all a client of the contract can send)."""


WHY = (
    "every worker new, as a client of the contract meets them: its first beat registers it "
    "and its first report is reconciled by its collector inside the timed beats, which "
    "metric 1's warm-up leaves out (it times steady beats only); every beat a report, not "
    "every other"
)
"""Why the plain client's ratio differs from the rounds' (what the bench measured, in short)."""


def sides(ctl: Controller, noop: NoopWorker) -> tuple[Side, Side]:
    """reaper's side (``ctl``) and the no-op's (``noop``, read by its counter)."""
    return (
        Side("reaper", ctl.task_queue, ctl.cpu_seconds),
        Side("no-op", noop.task_queue, noop.cpu_seconds, lambda: asyncio.to_thread(noop.handled)),
    )


async def beside(
    client: Client, ctl: Controller, noop: NoopWorker, workers: int, beats: int, handles: int
) -> CaseResult:
    """:data:`PLAIN` with ``workers`` x ``beats`` and ``handles`` containers per report,
    once against each side (the no-op first, new workflow ids): metric 1's plain-client
    line, measured in the bench's run."""
    reaper, no = sides(ctl, noop)
    case = PLAIN.with_(workers=workers, beats=beats, handles=handles)
    return (await compare(client, reaper, no, [case], 1, ctl.db_url, lambda _: None))[0]


def parse_case(base: Case, text: str) -> Case:
    """``base`` or ``key=value,key=value`` over ``base`` (keys: :class:`Case`'s fields)."""
    if text == "base":
        return base
    types = {f.name: type(getattr(base, f.name)) for f in fields(Case)}
    changes: dict[str, object] = {}
    for kv in text.split(","):
        k, _, v = kv.partition("=")
        t = types[k]
        changes[k] = bool(int(v)) if t is bool else t(v)
    return base.with_(**changes)


async def _main(args: argparse.Namespace) -> None:
    from bench.__main__ import MAIN_TIMINGS

    base = parse_case(Case(), args.base) if args.base else Case()
    cases = [parse_case(base, c) for c in args.case or ["base"]]
    env = await BenchEnv.start()
    try:
        extra = dict(kv.split("=", 1) for kv in args.setting)
        ctl = await env.start_controller("main", {**MAIN_TIMINGS, **extra})
        noop_w = env.start_noop_worker(f"plain-noop-{uuid.uuid4().hex[:6]}")
        await env.wait_noop(noop_w)
        reaper, noop = sides(ctl, noop_w)
        print(f"load average at start {os.getloadavg()}", flush=True)
        results = await compare(
            env.client,
            reaper,
            noop,
            cases,
            args.reps,
            ctl.db_url,
            lambda s: print(s, flush=True),
        )
        print(f"load average at end {os.getloadavg()}")
        for res in results:
            print("\n".join(res.lines()))
    finally:
        await env.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.plain_why", description=__doc__.split("\n")[0]
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions of every case")
    p.add_argument("--base", help="the base case's knobs, key=value,... (default Case())")
    p.add_argument(
        "--case",
        action="append",
        help="'base' or key=value,... over the base (repeatable; keys: workers, beats, "
        "in_flight, order, warm, report, handles, known, settle)",
    )
    p.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="REAPER_NAME=VALUE",
        help="the controller's setting over metric 1's timings (repeatable), e.g. "
        "REAPER_STALL_AFTER=3600s: no earlier burst's silent workers judged during the run",
    )
    asyncio.run(_main(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # the Temporal SDK can abort at interpreter exit (docs/platform-notes.md)
