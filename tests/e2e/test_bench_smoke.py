"""Smoke test of the benchmark: ``python -m bench --quick`` runs end to end on its own stack.

Targets are reported by the bench, not asserted here: this checks that every metric is
measured and printed, in its line and in the final table, and that the run exits 0 (every
process it started stopped, no metric left unmeasured).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.result import METRICS
from tests.support.paths import ROOT


@pytest.mark.e2e
def test_quick_bench_prints_every_metric() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REAPER_")}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-4000:]}\n{proc.stderr[-4000:]}"
    lines = out.splitlines()
    for key, name in METRICS:
        measured = [ln for ln in lines if ln.startswith(f"[{key}] {name}: ")]
        assert measured, f"metric {key} ({name}) not printed:\n{out[-4000:]}"
        assert measured[0].rstrip().endswith(("PASS", "MISS", "INFO")), measured[0]
        assert any(ln.startswith(f"{key} {name}") for ln in lines), f"{key} not in the table"
    assert "ERROR" not in out
