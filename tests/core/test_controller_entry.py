"""The kit starts the controller through the entry point the package declares
(``reaper-controller = "worker:main"``), the one ``python worker.py`` runs."""

from __future__ import annotations

import tomllib

import worker
from reaper.kit.controller import CONTROLLER_ENTRY_POINT, controller_argv
from tests.support.paths import ROOT


def test_the_declared_controller_is_worker_main() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[CONTROLLER_ENTRY_POINT] == "worker:main"
    assert controller_argv() == ("-c", "import sys, worker; sys.exit(worker.main())")
    assert callable(worker.main)
