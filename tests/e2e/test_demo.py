"""``reaper demo`` end to end: its own dev server, Postgres, controller and three agents."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DEMO_TIMEOUT_S = 150
"""The demo itself takes about 30 s on two cores; the rest is headroom for a loaded machine."""


@pytest.mark.e2e
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
        "all outcomes observed",
    ):
        assert outcome in out.stdout, out.stdout
    state = re.search(r"state in (\S+);", out.stdout)
    assert state is not None and not Path(state.group(1)).exists(), "temporary state left behind"
