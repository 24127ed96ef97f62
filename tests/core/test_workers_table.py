"""``reaper workers``' table shows every worker state, styled or not: a state added to
``reaper.core.states`` without a style of its own prints plain (its markup once failed with
rich's "closing tag '[/]' has nothing to close")."""

from __future__ import annotations

from typing import Any

import pytest

from reaper.cli.commands import workers
from reaper.core.states import WORKERS


def _row(state: str) -> dict[str, Any]:
    return {
        "worker": f"w-{state}",
        "state": state,
        "draining": False,
        "age_s": 3.0,
        "complete_reports": None,
        "missing": 0,
        "orphans": 0,
        "running_tasks": 0,
    }


@pytest.mark.parametrize("state", [*(s.value for s in WORKERS), "a-state-with-no-style"])
def test_every_state_prints(state: str, capsys: pytest.CaptureFixture[str]) -> None:
    workers.print_overview({"fleet": None, "workers": [_row(state)], "notes": []})
    assert state in capsys.readouterr().out
