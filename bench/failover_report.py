"""Metric 4's lines: each kill's ``lost`` (4a, 4d) and replacement (4b, 4e) beside the floor
measured in the same run, and the queue waits behind them (4c).

The floor of a kill is its ``BenchWatch`` fleet's (bench/floor.py): the cheapest liveness,
beaten and killed the same way under the same load. Each measured line says reaper's median
and maximum, the floor's maximum and how far reaper's is over it. 4a and 4b are judged
against ``LOST_AFTER`` (+1 s, +2 s: issue 20), 4d and 4e, with a CPU hog beside the stack,
against the floor's maximum (+1 s, +2 s: issue 36, "degrade like the floor"): under a hog
no liveness meets ``LOST_AFTER``, and what reaper owes is to lose no more than the floor.
"""

from __future__ import annotations

import os
import statistics

from bench.floor import watch_text, worst_watch
from bench.history import quantile, spread
from bench.loss import Loss
from bench.result import Metric, verdict

SDK_NOTE = "temporal_workflow_task_schedule_to_start_latency, every workflow task it ran"
FLOOR = "floor (BenchWatch, same run)"


def floor_max(loss: Loss) -> float | None:
    """The slowest ``BenchWatch`` victim's close after its last beat (seconds); ``None``
    when not every one closed within the wait (the floor's maximum is then unknown)."""
    if not loss.watch or len(loss.watch) < len(loss.victims):
        return None
    return max(loss.watch)


def limit(loss: Loss, slack: float, of_floor: bool) -> tuple[float | None, str]:
    """The most a victim may take (seconds after its last beat) and the target's text:
    ``LOST_AFTER + slack``, or with ``of_floor`` the floor's maximum + ``slack`` (``None``
    when the floor's maximum is unknown)."""
    if not of_floor:
        at = loss.lost_after + slack
        return at, f"<= {at:g} s (LOST_AFTER + {slack:g} s)"
    top = floor_max(loss)
    if top is None:
        return None, f"<= floor max + {slack:g} s (floor: not all closed in the wait)"
    return top + slack, f"<= {top + slack:.2f} s (floor max + {slack:g} s)"


def value(xs: list[float], loss: Loss, what: str) -> str:
    """``median a s, max b s; floor (BenchWatch, same run) max f s: +d s (LOST_AFTER l s)``,
    with how many victims were not ``what`` (lost, replaced) within the wait."""
    victims, give_up = len(loss.victims), loss.give_up
    text = f"median {statistics.median(xs):.2f} s, max {max(xs):.2f} s" if xs else "none"
    if len(xs) < victims:
        text += f"; {victims - len(xs)} of {victims} not {what} {give_up:.0f} s after the kill"
    top = floor_max(loss)
    if top is None:
        missing = len(loss.victims) - len(loss.watch)
        text += f"; {FLOOR}: {missing} of {victims} not closed {give_up:.0f} s after the kill"
    else:
        text += f"; {FLOOR} max {top:.2f} s"
        if xs and len(xs) == victims:
            text += f": {max(xs) - top:+.2f} s"
    return text + f" (LOST_AFTER {loss.lost_after:g} s)"


def judged(xs: list[float], loss: Loss, slack: float, of_floor: bool) -> tuple[str, str]:
    """The target's text and the verdict of ``xs`` (each victim's time after its last beat)
    against :func:`limit`. Against a floor that did not close every victim within the wait,
    reaper passes when it did (it was no slower than the floor)."""
    at, target = limit(loss, slack, of_floor)
    complete = len(xs) == len(loss.victims)
    if at is None:
        return target, verdict(complete)
    return target, verdict(complete and max(xs) <= at)


def loss_metrics(
    loss: Loss, k_lost: str, k_repl: str, head: str, label: str, of_floor: bool
) -> list[Metric]:
    """The two metrics of one kill (``lost``, replacement); ``of_floor`` judges them
    against the floor's maximum instead of ``LOST_AFTER``."""
    lost_after, give_up = loss.lost_after, loss.give_up
    ctl_cores, tmp_cores, gen_cores, load = loss.cores
    each = " + ".join(f"{c:.2f}" for c in loss.ctl_cores)
    procs = (
        f"{len(loss.ctl_cores)} controller processes {each} = {ctl_cores:.2f} CPU cores"
        if len(loss.ctl_cores) > 1
        else f"controller process {ctl_cores:.2f} CPU cores"
    )
    floor = (
        f"no-op timer of LOST_AFTER: {spread(loss.sleepers)} late"
        if loss.sleepers
        else "no-op timer: none closed"
    )
    common = [
        head + (f"; {label}" if label else ""),
        f"healthy workers wrongly stalled: {loss.false_stalls} ({loss.stalled_before} "
        "before the kill)",
        f"from the kill until the last replacement: {procs}, dev server {tmp_cores:.2f}, "
        f"load generator {gen_cores:.2f}, machine load "
        f"average {load:.1f} on {os.cpu_count()} cores; workflow tasks of {loss.sampled} "
        f"healthy workers' livenesses waited {spread(loss.waits)} in the task queue and took "
        f"{spread(loss.runs)} from start to completion on the controller "
        f"({len(loss.runs)} tasks)",
        f"the floor: {len(loss.sleepers)} BenchSleeper workflows (unsandboxed, a worker of "
        f"their own) started at the kill, each sleeping LOST_AFTER, closed {floor}",
        f"the floor under this load: {len(loss.victims)} of the same number of BenchWatch "
        "workflows (the cheapest liveness: each beat restarts one timer of LOST_AFTER; no "
        "rule, row or reap; unsandboxed, the no-op worker), beaten the same way before "
        f"reaper's fleet and killed at once, closed {watch_text(loss)}",
        f"outage grace (a deadline judged more than HEARTBEAT_INTERVAL late extends LOST_AFTER "
        f"by STALL_AFTER; controller logs): {loss.graces[0]} times for {loss.graces[1]} of the "
        f"victims, {loss.graces[2]} times for others",
        f"the victims' workflow tasks (deadline timers, state records, reap): waited "
        f"{spread(loss.vwaits)}, ran {spread(loss.vruns)}; their deadline timers fired "
        f"{spread(loss.vlate)} after due on the server",
    ]
    lost_target, lost_verdict = judged(loss.to_lost, loss, 1.0, of_floor)
    lost_m = Metric(
        k_lost,
        value(loss.to_lost, loss, "lost"),
        lost_target,
        lost_verdict,
        [
            *common,
            "per victim, last beat -> lost committed: "
            + ", ".join(f"{x:.2f}" for x in sorted(loss.to_lost)),
            "controller's own view (workers.state_since - last_heartbeat_at): "
            + ", ".join(f"{x:.2f}" for x in loss.ctl_view),
        ],
    )
    repl_target, repl_verdict = judged(loss.to_repl, loss, 2.0, of_floor)
    repl_m = Metric(
        k_repl,
        value(loss.to_repl, loss, "replaced"),
        repl_target,
        repl_verdict,
        [
            "per victim, last beat -> replacement placed: "
            + ", ".join(f"{x:.2f}" for x in sorted(loss.to_repl)),
            f"slowest victim {loss.slow}, seconds after its last beat (server event times):",
        ]
        + [f"  {p}" for p in loss.paths],
    )
    for m, xs in ((lost_m, loss.to_lost), (repl_m, loss.to_repl)):
        if m.verdict == "MISS":
            worst_s = (
                f"{max(xs) - lost_after:.2f} s"
                if len(xs) == len(loss.victims)
                else f"more than {give_up - lost_after:.0f} s"
            )
            m.why = (
                f"worst {worst_s} past LOST_AFTER (a no-op timer of LOST_AFTER: at most "
                f"{max(loss.sleepers, default=0):.2f} s; a no-op liveness under the same "
                f"load: {worst_watch(loss)}), with the controllers "
                f"at {ctl_cores:.2f} cores and the dev server at {tmp_cores:.2f} on a "
                f"machine at load {load:.1f}: the victims' deadline timers fired up to "
                f"{max(loss.vlate, default=0):.2f} s late on the server; their workflow tasks "
                f"waited up to {max(loss.vwaits, default=0):.2f} s in the task queue and ran up "
                f"to {max(loss.vruns, default=0):.2f} s; the outage grace was granted "
                f"{loss.graces[0]} times to {loss.graces[1]} victims; after the lost timer, "
                "the WorkerReap child's first task follows in sequence (at peer version 1.0, "
                "without in-task-loss, also the record_worker_state and reap_worker "
                "activities and a task between them; the slowest victim's events are listed)"
            )
    return [lost_m, repl_m]


def queue_waits(loads: list[tuple[Loss, str]]) -> Metric:
    """4c: the healthy livenesses' workflow-task waits in the task queue per kill, from
    their histories, beside the controllers' SDK histogram (merged over the processes)."""
    parts, details = [], []
    for loss, label in loads:
        parts.append(
            f"p99 {quantile(loss.waits, 0.99):.2f} s, max {max(loss.waits, default=0):.2f} s"
            + (f" {label}" if label else "")
        )
        p99, count = loss.sdk_p99
        details.append(
            f"{label or 'alone'}: workflow tasks of {loss.sampled} healthy livenesses, from the "
            f"kill until the last replacement, waited {spread(loss.waits)} in the task queue "
            f"({len(loss.waits)} tasks, from their histories); the {len(loss.ctl_cores)} "
            f"controller processes' SDK histogram ({SDK_NOTE}): p99 <= {p99:.2f} s, max <= "
            f"{loss.sdk_max:.2f} s over {count:,} workflow tasks"
        )
    return Metric("4c", "; ".join(parts), "(reported)", "INFO", details)
