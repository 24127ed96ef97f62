"""Metric 10's line (bench/rotate.py): reaper's rotation against the floor's
(bench/rotate_floor.py), its target (the floor plus ``2 x HEARTBEAT_INTERVAL`` per wave) and
the details printed under it, per wave.
"""

from __future__ import annotations

import math
import statistics

from bench.result import Metric, verdict
from bench.rotate_floor import Waves


def metric(
    key: str,
    surge: int,
    reaper: Waves,
    floor_: Waves,
    answered: float,
    agents_part: list[float],
    hb: float,
    services: int,
    tasks: int,
    others: int,
    deadline: str,
) -> Metric:
    """Metric ``key``: ``reaper``'s rotation (the drain update answered ``answered`` s after
    it was sent; its deadline ``deadline``) against ``floor_``'s, for ``tasks`` tasks of
    ``services`` services at ``max_surge`` ``surge``, ``others`` targets beating every ``hb``."""
    per = tasks // services
    waves = math.ceil(per / surge)
    limit = floor_.total + 2 * hb * waves
    over = (reaper.total - floor_.total) / waves
    value = (
        f"{reaper.total:.2f} s vs floor {floor_.total:.2f} s, {waves} waves: "
        f"{over:+.2f} s per wave over the floor"
    )
    rd, fd = reaper.durations(), floor_.durations()
    details = [
        f"{tasks} tasks of {services} services ({per} each, max_surge {surge}) on one worker, "
        f"drained with migrate (deadline {deadline}) against {others} other workers beating "
        f"every {hb:g} s (HEARTBEAT_INTERVAL; each reads state after every beat, as reaper "
        f"agent does); from the drain update's answer ({answered:.2f} s after it was sent) to "
        "the worker's drained events row",
        f"the floor: the same {others} agents beating BenchNoop workflows every {hb:g} s with "
        f"no controller; each service's tasks handed {surge} at a time straight to the least "
        "loaded agent's list, the next batch once an accepted beat carried the last one",
        "per wave, reaper / floor (s): "
        + ", ".join(f"{a:.2f} / {b:.2f}" for a, b in zip(rd, fd, strict=False)),
        "per wave, reaper over the floor (s): "
        + ", ".join(f"{a - b:+.2f}" for a, b in zip(rd, fd, strict=False))
        + f" (allowed {2 * hb:g} s a wave)",
        "reaper's slowest service per wave, seconds after the wave before ended (placed, "
        "replacement running, original stopped): "
        + "; ".join(f"{p:.2f}, {r:.2f}, {s:.2f}" for p, r, s in reaper.parts),
    ]
    if agents_part:
        details.append(
            f"the agents' part inside reaper's run (a replacement placed until its agent's "
            f"accepted beat carried it): median {statistics.median(agents_part):.2f} s, "
            f"max {max(agents_part):.2f} s over {len(agents_part)} replacements"
        )
    m = Metric(
        key,
        value,
        f"<= floor + 2 x {hb:g} s x {waves} = {limit:.2f} s",
        verdict(reaper.total <= limit),
        details,
    )
    if m.verdict == "MISS":
        m.why = (
            f"{reaper.total - limit:.2f} s past the target; per wave above (an agent reads "
            "state after a beat and starts a task the beat after the read that shows it; the "
            "reconcile and the woken upkeep add a fixed part that weighs most at short "
            "intervals and on a loaded machine: see the agents' part above)"
        )
    return m
