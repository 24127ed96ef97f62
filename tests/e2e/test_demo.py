"""``reaper demo`` end to end: its own dev server, Postgres, controller and its agents."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DEMO_TIMEOUT_S = 150
"""The demo itself takes about 35 s on two cores; the rest is headroom for a loaded machine."""


@pytest.mark.e2e
@pytest.mark.own_stack
def test_demo_observes_every_outcome_and_exits_0(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REAPER_")}
    out = subprocess.run(
        [sys.executable, "-m", "reaper.cli", "demo"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
    )
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    for outcome in (
        "(a) v-demo-a still present",
        "(b) demo-b stalled",
        "(b) demo-b lost",
        "(b) task web-2 lost",
        "(c) reaped task web-2 listed in demo-b's orphans",
        "(c) no duplicate",
        "(d) stopped agent demo-c (SIGTERM): it sent retire and exited 0",
        "(d) task web-3 lost (stop_reason worker-retired); replacement",
        "(no LOST_AFTER wait",
        "(d) workers row of demo-c 'retired'; liveness-demo-c completed",
        "(e) reaper drain demo-a and demo-b: both draining",
        "(e) reaper retire demo-a: ",
        "owed (pending, worker NULL); demo-a retired",
        "(e) started a new agent demo-d (fresh state directory)",
        "placed on demo-d",
        "(e) demo-d started",
        "service web back at 3/3, exactly 3 active tasks",
        "all outcomes observed",
    ):
        assert outcome in out.stdout, out.stdout
    # The timeline is in order: each step's outcomes after the previous step's.
    firsts = [out.stdout.find(f"s  ({step}) ") for step in "abcde"]
    assert -1 not in firsts and firsts == sorted(firsts), out.stdout
    state = re.search(r"state in (\S+);", out.stdout)
    assert state is not None and not Path(state.group(1)).exists(), "temporary state left behind"
