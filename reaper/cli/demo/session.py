"""One demo run: what it started (stack, agents, clients), its timeline and how it waits.

:class:`Demo` holds every process and connection of a run so that cleanup can stop them
whatever happened; :meth:`Demo.until` is the one way a step observes an outcome (polling
with a deadline, :class:`DemoFailed` when it is not seen).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console

from reaper.cli.stack import Stack
from reaper.core.config import Settings
from reaper.core.contract import StateView, liveness_id
from reaper.kit.agents import query_state
from reaper.kit.processes import Child

if TYPE_CHECKING:
    import asyncpg
    from temporalio.client import Client

T = TypeVar("T")

AGENTS = ("demo-a", "demo-b", "demo-c")
"""The demo's first workers, one ``reaper agent`` process each."""
LEAVING = "demo-c"
"""The agent started with ``--retire-on-stop``: its stop is the scale-in of step (d)."""
JOINING = "demo-d"
"""The worker that joins in step (e) (a new name, a fresh state directory)."""
SERVICE = "web"
"""The demo's service: three tasks, ``web-1`` on ``demo-a`` and so on."""
STEP_TIMEOUT_S = 45.0
"""Deadline of each observed outcome, in seconds beyond what the timings themselves need."""
POLL_S = 0.1
"""How often an outcome is polled for, in seconds."""


class DemoFailed(Exception):
    """An outcome was not observed; ``step`` names it."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(f"{step}: {detail}")
        self.step = step
        self.detail = detail


@dataclass
class Timeline:
    """Prints ``elapsed  event`` lines, elapsed seconds since the demo started."""

    console: Console
    verbose: bool = False
    start: float = field(default_factory=time.monotonic)
    events: list[tuple[float, str]] = field(default_factory=list)

    def __call__(self, event: str) -> None:
        """Record and print ``event`` (rich markup allowed)."""
        at = time.monotonic() - self.start
        self.events.append((at, event))
        self.console.print(f"[cyan]{at:7.1f}s[/]  {event}", highlight=False, soft_wrap=True)

    def detail(self, text: str) -> None:
        """Print ``text`` dimmed, only with ``--verbose``."""
        if self.verbose:
            self.console.print(
                f"[dim]{time.monotonic() - self.start:7.1f}s    {text}[/]",
                highlight=False,
                soft_wrap=True,
            )


@dataclass
class Demo:
    """Everything the demo started, so that cleanup can stop it whatever happened.

    Args:
        root: the run's temporary directory (``stack/``, ``agents/<name>/``, ``logs/``).
        settings: the private stack's settings (:func:`reaper.cli.demo.runner.demo_settings`).
        stack: the private embedded stack, started by the runner.
        timeline: where steps report what they observed.
    """

    root: Path
    settings: Settings
    stack: Stack
    timeline: Timeline
    agents: dict[str, Child] = field(default_factory=dict)
    client: Client | None = None
    pool: asyncpg.Pool | None = None

    @property
    def db(self) -> asyncpg.Pool:
        """The Postgres pool (for :mod:`reaper.cli.read`); set once the stack is up."""
        assert self.pool is not None, "the demo's Postgres pool is not open yet"
        return self.pool

    def agent_dir(self, name: str) -> Path:
        """State directory of agent ``name`` (``containers/``, ``volumes/``, ``tasks/``)."""
        return self.root / "agents" / name

    def start_agent(self, name: str, *, retire_on_stop: bool = False) -> Child:
        """Start ``reaper agent --worker name`` against the private stack; log in ``logs/``.
        With ``retire_on_stop``, its stop (SIGTERM) retires the worker."""
        argv = [
            sys.executable,
            "-m",
            "reaper.cli",
            "agent",
            "--worker",
            name,
            "--state-dir",
            str(self.agent_dir(name)),
        ]
        if retire_on_stop:
            argv.append("--retire-on-stop")
        child = Child(
            f"agent {name}",
            argv,
            self.stack.controller_env(),
            log_path=self.root / "logs" / f"agent-{name}.log",
            restart=False,
        )
        child.start()
        self.agents[name] = child
        return child

    def stop_all(self) -> None:
        """Stop every agent, then the stack; never raises on an agent that will not stop."""
        for child in self.agents.values():
            try:
                child.stop(timeout=5)
            except Exception:
                pass
        self.stack.stop()

    async def until(
        self, step: str, probe: Callable[[], Awaitable[T]], ok: Callable[[T], bool], timeout: float
    ) -> T:
        """Poll ``probe`` every 0.1 s until ``ok`` holds and return what it returned.

        Meanwhile dead stack children are restarted (and that is put on the timeline).

        Raises:
            DemoFailed: ``step``, not observed within ``timeout`` seconds (the last value
                or error seen is in the detail).
            StackError: the controller refused its configuration.
        """
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            try:
                value = await probe()
                last = value
                if ok(value):
                    return value
            except Exception as exc:  # a query before the controller is up, say
                last = f"{type(exc).__name__}: {exc}"
            for message in self.stack.check():
                self.timeline(f"[yellow]{message}[/]")
            if time.monotonic() > deadline:
                raise DemoFailed(step, f"not observed within {timeout:g}s; last seen: {last!r}")
            await asyncio.sleep(POLL_S)

    async def stop_agent(self, name: str) -> int:
        """SIGTERM agent ``name`` and wait for it to exit; its exit status."""
        child = self.agents[name]
        await asyncio.to_thread(child.stop, 10)
        assert child.proc is not None
        return child.proc.returncode

    async def cli(self, step: str, *args: str) -> str:
        """Run ``reaper ARGS --address <this stack>`` as an operator would; its stdout.

        Raises:
            DemoFailed: ``step``, the command exited with a status other than 0.
        """
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "reaper.cli",
            *args,
            "--address",
            self.stack.temporal_address,
            env=self.stack.controller_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, errs = await proc.communicate()
        if proc.returncode != 0:
            raise DemoFailed(
                step,
                f"`reaper {' '.join(args)}` exited {proc.returncode}: "
                + errs.decode(errors="replace").strip(),
            )
        return out.decode(errors="replace").strip()

    async def liveness_running(self, worker: str) -> bool:
        """Whether ``liveness-{worker}`` is running (a retired worker's has completed)."""
        from temporalio.client import WorkflowExecutionStatus

        assert self.client is not None, "the demo's Temporal client is not connected yet"
        desc = await self.client.get_workflow_handle(liveness_id(worker)).describe()
        return desc.status is WorkflowExecutionStatus.RUNNING

    async def view(self, worker: str) -> StateView:
        """The ``state`` query of ``worker``'s liveness (3 s deadline).

        Raises:
            temporalio.service.RPCError: the query failed (no such workflow, no controller).
        """
        assert self.client is not None, "the demo's Temporal client is not connected yet"
        return await query_state(self.client, worker, rpc_timeout=3)
