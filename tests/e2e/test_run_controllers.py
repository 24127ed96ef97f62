"""``reaper run`` with several controller processes (``REAPER_CONTROLLERS``, issue 36): each
polls the task queue, serves metrics on ports of its own and logs to a file of its own; one
that dies is restarted; Ctrl-C stops them all."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from urllib.request import urlopen

import psutil
import pytest

from reaper.kit.processes import free_port, is_listening
from tests.support.cli import start_run

SERVING = "serving task queue"
"""What a controller logs once it polls its task queue (worker.py)."""


def metrics_base() -> int:
    """A port ``p`` with ``p`` to ``p + 3`` free: two processes' metrics and SDK ports."""
    for _ in range(50):
        port = free_port()
        if port + 3 <= 65535 and not any(is_listening("127.0.0.1", port + i) for i in range(4)):
            return port
    raise RuntimeError("no four free ports in a row")


def until(check: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    """Poll ``check`` (every 0.2 s) until true; fails if ``reaper run`` exits or 90 s pass."""
    deadline = time.monotonic() + 90
    while not check():
        assert proc.poll() is None, f"reaper run exited before {what}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {what} in 90 s:\n{log.read_text()}"
        time.sleep(0.2)


@pytest.mark.e2e
@pytest.mark.own_stack
def test_run_starts_supervises_and_stops_every_controller_process(tmp_path: Path) -> None:
    port, ui, metrics = free_port(), free_port(), metrics_base()
    state = tmp_path / "state"
    proc, log = start_run(
        tmp_path,
        "--controllers",
        "2",
        REAPER_TEMPORAL_ADDRESS=f"127.0.0.1:{port}",
        REAPER_UI_PORT=str(ui),
        REAPER_STATE_DIR=str(state),
        REAPER_METRICS_PORT=str(metrics),
        REAPER_SDK_METRICS_PORT=str(metrics + 1),
    )
    logs = [state / "logs" / f"controller-{k}.log" for k in (1, 2)]

    def serving(path: Path, times: int = 1) -> bool:
        return path.exists() and path.read_text().count(SERVING) >= times

    try:
        until(lambda: all(serving(p) for p in logs), proc, log, "two controllers serving")
        text = log.read_text()
        pids = {int(k): int(p) for k, p in re.findall(r"controller (\d) started \(pid (\d+)", text)}
        assert set(pids) == {1, 2} and pids[1] != pids[2], text
        # Each process serves its metrics and the SDK's on ports of its own.
        for p in (metrics, metrics + 1, metrics + 2, metrics + 3):
            with urlopen(f"http://127.0.0.1:{p}/metrics", timeout=10) as resp:
                assert resp.status == 200, p
        # A controller that dies is restarted, the other left alone.
        os.kill(pids[2], signal.SIGKILL)
        until(lambda: "controller 2 restarted" in log.read_text(), proc, log, "a restart")
        until(lambda: serving(logs[1], 2), proc, log, "the restarted controller serving")
        assert psutil.Process(pids[1]).is_running()
        assert "controller 1 exited" not in log.read_text()
        restarted = int(re.findall(r"controller 2 restarted \(pid (\d+)\)", log.read_text())[0])
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, log.read_text()
        for pid in (pids[1], restarted):
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
        assert not is_listening("127.0.0.1", port)
    finally:
        if proc.poll() is None:  # a failed assertion: still stop the stack it started
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
