"""A short chaos campaign (``python -m chaos``, issue 11) breaks no rule.

A fixed seed, few rounds: its own dev server, Postgres and two controller replicas, faults
drawn from the seed (replicas SIGKILLed, Temporal and Postgres restarted, tables locked),
the invariant checker over every step and after the quiet period. Run as the command
itself, in a process of its own, judged by its exit status and its last line.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

SEED, ROUNDS = 8, 18
"""The plan follows from the seed: these 18 rounds lock two tables, SIGKILL both replicas
and each alone, stop Postgres cleanly and by a crash, terminate the controllers' sessions,
silence agents (one dies: lost and reaped) and drop, flap and add handles. At peer version
1.2 rounds 6, 9 and 17 also draw a host rotation (a drain with migrate), done if a host runs
tasks by then (how soon one does follows the machine's load); at 1.1, whose drain does not
migrate, no round draws one."""
TIMEOUT_S = 200
"""The campaign takes about a minute here; this is headroom for a loaded machine (setup
and quiet period are bounded inside it: 120 s and SETTLE_BOUND_S), and with the minute
its SIGTERM may take, stays under pytest's 300 s timeout."""
ROTATIONS = re.compile(
    r"^\[ *[\d.]+s\] rotations: (?P<done>\d+) of (?P<drawn>\d+) drawn ", re.MULTILINE
)
"""The summary's line of host rotations (peer version 1.2 only): those done of those drawn
(a draw rotates nothing when no host runs tasks yet)."""
LAST = re.compile(
    r"^chaos: (?P<r>\d+) rounds, (?P<k>\d+) kills, (?P<d>\d+) destroys, "
    r"(?P<p>\d+) reaps, (?P<v>\d+) violations$"
)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "peer_version",
    [
        pytest.param("1.1", marks=pytest.mark.smoke, id="peer-1.1"),
        # This line's own once the operator raises it (rollout.py). Not in make test: a
        # second campaign's stack beside the four test processes made unrelated tests
        # miss their deadlines on fresh clones (2026-12-06); run it with -m slow.
        pytest.param("1.2", marks=pytest.mark.slow, id="peer-1.2"),
    ],
)
def test_a_short_chaos_campaign_breaks_no_rule(peer_version: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REAPER_")}
    argv = ["--seed", str(SEED), "--rounds", str(ROUNDS), "--peer-version", peer_version]
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaos", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the campaign stops its stack on SIGTERM
        out, _ = proc.communicate(timeout=60)
        pytest.fail(f"the campaign did not finish in {TIMEOUT_S}s:\n{out[-6000:]}")
    last = out.strip().splitlines()[-1] if out.strip() else ""
    m = LAST.match(last)
    assert m is not None, f"unexpected last line {last!r}:\n{out[-6000:]}"
    assert int(m["v"]) == 0 and proc.returncode == 0, out[-8000:]
    assert int(m["r"]) == ROUNDS and int(m["k"]) > 0, last
    rotations = ROTATIONS.search(out)
    if peer_version == "1.1":
        assert rotations is None, rotations
    else:
        assert rotations is not None and int(rotations["drawn"]) == 3, out[-3000:]
        print(f"\n{rotations[0]}")
    print(f"\n{last}")
