"""``reaper demo``'s runner: the private stack, the scenario around the steps, the cleanup.

The run gets its own temporary directory, free ports and short timings, so it runs beside
``reaper run``; whatever happens (a step not observed, a stack failure, Ctrl-C, SIGTERM),
every process it started is stopped, and the directory is kept when something failed.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from reaper.cli.demo.session import Demo, DemoFailed, Timeline
from reaper.cli.demo.steps import run_steps
from reaper.cli.stack import Stack
from reaper.core.config import Settings
from reaper.kit.processes import StackError, free_port, tail

DEMO_TIMINGS: dict[str, Any] = dict(
    heartbeat_interval=1.0,
    stall_after=3.0,
    lost_after=8.0,
    missing_ttl=5.0,
    resync_interval=2.0,
)
"""Short timings in seconds that keep the validation rules (stall >= 2 x beat, lost > stall,
TTL >= 3 x beat)."""
CONNECT_DEADLINE_S = 30.0
"""How long the demo waits for its own Temporal and Postgres to accept connections."""


def demo_settings(root: Path) -> Settings:
    """Settings of the private stack: free ports, short timings; the environment is ignored."""
    return Settings(
        _env_file=None,
        temporal_address=f"127.0.0.1:{free_port()}",
        ui_port=free_port(),
        namespace="default",
        task_queue="reaper",
        database_url=None,
        state_dir=str(root / "stack"),
        creating_timeout=3600.0,
        disruption_threshold=0.55,
        dry_run=False,
        controllers=1,  # one controller log to show, whatever the host's cores
        **DEMO_TIMINGS,
    )


def run_demo(console: Console, *, keep: bool = False, verbose: bool = False) -> int:
    """Run the whole demo; 0 if every outcome was observed, 1 otherwise, 130 on Ctrl-C."""
    root = Path(tempfile.mkdtemp(prefix="reaper-demo-"))
    settings = demo_settings(root)
    timeline = Timeline(console, verbose=verbose)
    stack = Stack(settings, controller_log=root / "logs" / "controller.log")
    demo = Demo(root=root, settings=settings, stack=stack, timeline=timeline)

    def on_term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    code = 1
    console.print(
        f"reaper demo: state in {root}; heartbeat {settings.heartbeat_interval:g}s, "
        f"stalled after {settings.stall_after:g}s, lost after "
        f"{settings.lost_after:g}s, missing TTL {settings.missing_ttl:g}s",
        highlight=False,
        soft_wrap=True,
    )
    try:
        asyncio.run(_scenario(demo))
        code = 0
    except DemoFailed as exc:
        console.print(f"[bold red]FAILED[/] at step {exc.step!r}: {exc.detail}", highlight=False)
        _show_logs(console, demo)
    except StackError as exc:
        console.print(f"[bold red]FAILED[/] (embedded stack): {exc}", highlight=False)
        _show_logs(console, demo)
    except KeyboardInterrupt:
        console.print("interrupted")
        code = 130
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        demo.stop_all()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if keep or code == 1:  # a failure: keep the logs to look at
            console.print(f"state and logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    if code == 0:
        timeline("all outcomes observed; everything stopped")
    return code


def _show_logs(console: Console, demo: Demo) -> None:
    """The last lines of the controller's and every agent's log (after a failure)."""
    logs = [demo.stack.controller_log] + [c.log_path for c in demo.agents.values()]
    for path in logs:
        text = tail(path, 15)
        if text:
            console.print(f"[dim]--- last lines of {path} ---\n{text}[/]", highlight=False)


async def _scenario(d: Demo) -> None:
    """Start the stack, connect to it, run the steps; the pool is closed whatever happens."""
    from reaper.infra.db import create_pool
    from reaper.infra.temporal import connect

    t, s = d.timeline, d.settings
    d.stack.start(on_progress=t)
    if d.stack.ui_url:
        t(f"Web UI of this demo's dev server: {d.stack.ui_url}")
    try:
        d.client = await connect(
            d.stack.temporal_address, s.namespace, deadline_s=CONNECT_DEADLINE_S
        )
        d.pool = await create_pool(d.stack.database_url, deadline_s=CONNECT_DEADLINE_S, max_size=4)
        await run_steps(d)
    finally:
        if d.pool is not None:
            await d.pool.close()
