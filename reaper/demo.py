"""``reaper demo``: one finite end-to-end run on a private embedded stack.

It starts its own Temporal dev server (free ports), Postgres and controller under a temporary
directory, so it can run beside ``reaper run``; then three ``reaper agent`` processes, a service
of three tasks (one per agent) and a container and a volume per agent. Then:

a. one agent loses a volume entry: the row is destroyed once ``MISSING_TTL`` has passed, and
   not before;
b. another agent is killed with SIGKILL: its worker goes ``stalled``, then ``lost``; its task
   becomes ``lost`` and a replacement runs on a surviving agent;
c. the killed agent comes back (new boot id, same directory, so it still holds its old task):
   the reaped task is in its ``orphans``, the agent removes it, and the service has exactly
   three running tasks.

Every outcome is polled for with a deadline; the command exits 0 only if all were observed.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

from rich.console import Console

from reaper.core.config import Settings
from reaper.stack import Child, Stack, StackError, free_port, tail

T = TypeVar("T")

AGENTS = ("demo-a", "demo-b", "demo-c")
SERVICE = "web"
DEMO_TIMINGS: dict[str, float] = dict(
    heartbeat_interval=1.0, stall_after=3.0, lost_after=8.0, missing_ttl=5.0,
    resync_interval=2.0,
)
"""Short timings that keep the validation rules (stall >= 2 x beat, lost > stall,
TTL >= 3 x beat)."""
STEP_TIMEOUT_S = 45.0
"""Deadline of each observed outcome, in seconds beyond what the timings themselves need."""
TTL_SLACK_S = 1.0
""""Just before the TTL": the row must still be present this close to its due time."""


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
        at = time.monotonic() - self.start
        self.events.append((at, event))
        self.console.print(f"[cyan]{at:7.1f}s[/]  {event}", highlight=False, soft_wrap=True)

    def detail(self, text: str) -> None:
        if self.verbose:
            self.console.print(f"[dim]{time.monotonic() - self.start:7.1f}s    {text}[/]",
                               highlight=False, soft_wrap=True)


@dataclass
class Demo:
    """Everything the demo started, so that cleanup can stop it whatever happened."""

    root: Path
    settings: Settings
    stack: Stack
    timeline: Timeline
    agents: dict[str, Child] = field(default_factory=dict)
    client: Any = None
    pool: Any = None

    def agent_dir(self, name: str) -> Path:
        return self.root / "agents" / name

    def start_agent(self, name: str) -> Child:
        argv = [sys.executable, "-m", "reaper.cli", "agent", "--worker", name,
                "--state-dir", str(self.agent_dir(name))]
        child = Child(f"agent {name}", argv, self.stack.controller_env(),
                      log_path=self.root / "logs" / f"agent-{name}.log", restart=False)
        child.start()
        self.agents[name] = child
        return child

    def stop_all(self) -> None:
        for child in self.agents.values():
            try:
                child.stop(timeout=5)
            except Exception:
                pass
        self.stack.stop()

    # ---- observation helpers -------------------------------------------------------------

    async def until(self, step: str, probe: Callable[[], Awaitable[T]],
                    ok: Callable[[T], bool], timeout: float) -> T:
        """Poll ``probe`` every 0.1 s until ``ok`` holds; :class:`DemoFailed` at the deadline."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            try:
                last = await probe()
                if ok(last):
                    return last
            except Exception as exc:  # a query before the controller is up, say
                last = f"{type(exc).__name__}: {exc}"
            for message in self.stack.check():
                self.timeline(f"[yellow]{message}[/]")
            if time.monotonic() > deadline:
                raise DemoFailed(step, f"not observed within {timeout:g}s; last seen: {last!r}")
            await asyncio.sleep(0.1)

    async def view(self, worker: str) -> Any:
        from reaper.core.contract import StateView
        from workflows.common import liveness_id
        from workflows.liveness import WorkerLiveness

        return await self.client.get_workflow_handle(liveness_id(worker)).query(
            WorkerLiveness.state, result_type=StateView, rpc_timeout=timedelta(seconds=3)
        )

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await self.pool.fetchval(sql, *args)

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        return await self.pool.fetchrow(sql, *args)


def demo_settings(root: Path) -> Settings:
    """Settings of the private stack: free ports, short timings; the environment is ignored."""
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        temporal_address=f"127.0.0.1:{free_port()}",
        ui_port=free_port(),
        namespace="default",
        task_queue="reaper",
        database_url=None,
        state_dir=str(root / "stack"),
        creating_timeout=3600.0,
        disruption_threshold=0.55,
        dry_run=False,
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
    console.print(f"reaper demo: state in {root}; heartbeat {settings.heartbeat_interval:g}s, "
                  f"stalled after {settings.stall_after:g}s, lost after "
                  f"{settings.lost_after:g}s, missing TTL {settings.missing_ttl:g}s",
                  highlight=False, soft_wrap=True)
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
    logs = [demo.stack.controller_log] + [c.log_path for c in demo.agents.values()]
    for path in logs:
        text = tail(path, 15)
        if text:
            console.print(f"[dim]--- last lines of {path} ---\n{text}[/]", highlight=False)


async def _scenario(d: Demo) -> None:
    from activities.db import create_pool
    from activities.temporal import connect

    t, s = d.timeline, d.settings
    d.stack.start(on_progress=t)
    if d.stack.ui_url:
        t(f"Web UI of this demo's dev server: {d.stack.ui_url}")
    try:
        d.client = await connect(d.stack.temporal_address, s.namespace, deadline_s=30)
        d.pool = await create_pool(d.stack.database_url, deadline_s=30, max_size=4)
        await _run_steps(d)
    finally:
        if d.pool is not None:
            await d.pool.close()


async def _run_steps(d: Demo) -> None:
    t, s = d.timeline, d.settings
    await d.until("controller ready (schema migrated)",
                  lambda: d.fetchval("SELECT to_regclass('reaper.fleet')::text"),
                  lambda v: v is not None, STEP_TIMEOUT_S)
    t("controller ready: schema migrated")
    await _seed(d)
    for name in AGENTS:
        d.start_agent(name)
    t(f"started agents {', '.join(AGENTS)} (one state directory each)")

    for i, name in enumerate(AGENTS, start=1):
        await d.until(f"{name} running", lambda n=name: d.view(n),
                      lambda v: v.state == "running", STEP_TIMEOUT_S)
    t("all three workers running (liveness-demo-a/b/c)")
    for i, name in enumerate(AGENTS, start=1):
        task = f"{SERVICE}-{i}"
        await d.until(f"{task} running on {name}",
                      lambda tk=task: d.fetchval("SELECT state FROM reaper.tasks WHERE id = $1", tk),
                      lambda st: st == "running", STEP_TIMEOUT_S)
        if not (d.agent_dir(name) / "tasks" / task).exists():
            raise DemoFailed(f"{task} running on {name}", "no entry in the agent's tasks/")
    t(f"tasks {SERVICE}-1..3 started by their agents and running: service {SERVICE} at 3/3")

    await _step_missing_volume(d)
    await _step_kill_agent(d)
    await _step_return(d)


async def _seed(d: Demo) -> None:
    """A service of 3, one pending task per agent, one container and one volume per agent."""
    async with d.pool.acquire() as conn, conn.transaction():
        await conn.execute("INSERT INTO reaper.services (name, desired_count) VALUES ($1, 3)",
                           SERVICE)
        for i, name in enumerate(AGENTS, start=1):
            base = d.agent_dir(name)
            for kind in ("containers", "volumes", "tasks"):
                (base / kind).mkdir(parents=True, exist_ok=True)
            (base / "containers" / f"c-{name}").touch()
            (base / "volumes" / f"v-{name}").touch()
            await conn.execute("INSERT INTO reaper.containers (handle, worker, state)"
                               " VALUES ($1, $2, 'created')", f"c-{name}", name)
            await conn.execute("INSERT INTO reaper.volumes (handle, worker, state)"
                               " VALUES ($1, $2, 'created')", f"v-{name}", name)
            await conn.execute("INSERT INTO reaper.tasks (id, service, worker, state)"
                               " VALUES ($1, $2, $3, 'pending')", f"{SERVICE}-{i}", SERVICE, name)
    d.timeline(f"seeded: service {SERVICE} (desired 3), pending tasks {SERVICE}-1..3 placed on "
               "demo-a/b/c, a container and a volume per agent (entries + rows 'created')")


async def _step_missing_volume(d: Demo) -> None:
    """(a) A volume entry disappears: destroyed after MISSING_TTL, not before."""
    t, ttl = d.timeline, d.settings.missing_ttl
    step = "(a) missing volume destroyed after the TTL"
    worker, handle = "demo-a", "v-demo-a"
    (d.agent_dir(worker) / "volumes" / handle).unlink()
    t(f"(a) removed volume entry {handle} from {worker}")
    marked: datetime = await d.until(
        step, lambda: d.fetchval("SELECT missing_since FROM reaper.volumes WHERE handle = $1",
                                 handle),
        lambda v: v is not None, STEP_TIMEOUT_S)
    due = marked + timedelta(seconds=ttl)
    t(f"(a) {handle} marked missing (missing_since set); due for destroy {ttl:g}s later")
    last_present: datetime | None = None
    deadline = time.monotonic() + ttl + STEP_TIMEOUT_S
    while True:
        row = await d.fetchrow("SELECT now() AS now, EXISTS (SELECT 1 FROM reaper.volumes"
                               " WHERE handle = $1) AS present", handle)
        if not row["present"]:
            gone_at: datetime = row["now"]
            break
        last_present = row["now"]
        if time.monotonic() > deadline:
            raise DemoFailed(step, f"{handle} still present {ttl + STEP_TIMEOUT_S:g}s after "
                                   "it was marked")
        await asyncio.sleep(0.1)
    event = await d.fetchrow(
        "SELECT at, reason FROM reaper.events WHERE kind = 'volume' AND handle = $1"
        " AND action = 'destroyed'", handle)
    if event is None:
        raise DemoFailed(step, f"no events row 'destroyed' for {handle}")
    if event["at"] < due:
        raise DemoFailed(step, f"destroyed at {event['at']}, before its due time {due}")
    if last_present is None or last_present < due - timedelta(seconds=TTL_SLACK_S):
        raise DemoFailed(step, f"{handle} was not seen present just before its due time "
                               f"(last seen {last_present}, due {due})")
    present_for = (last_present - marked).total_seconds()
    late = (event["at"] - due).total_seconds()
    t(f"(a) {handle} still present {present_for:.1f}s after the mark (TTL {ttl:g}s); "
      f"destroyed {late:.1f}s after the TTL ran out, events row 'destroyed' "
      f"(reason {event['reason']!r}); row gone {(gone_at - marked).total_seconds():.1f}s "
      "after the mark")


async def _step_kill_agent(d: Demo) -> None:
    """(b) SIGKILL an agent: stalled, lost, its task lost and replaced on a survivor."""
    t, s = d.timeline, d.settings
    victim, task = "demo-b", f"{SERVICE}-2"
    d.agents[victim].kill()
    killed = time.monotonic()
    t(f"(b) killed agent {victim} with SIGKILL (it held task {task})")
    both = lambda st: (lambda v: v[0] == st and v[1] == st)  # noqa: E731

    async def states() -> tuple[str, str | None]:
        view = await d.view(victim)
        row = await d.fetchval("SELECT state FROM reaper.workers WHERE name = $1", victim)
        return view.state, row

    await d.until(f"(b) {victim} stalled", states, both("stalled"),
                  s.stall_after + STEP_TIMEOUT_S)
    t(f"(b) {victim} stalled ({time.monotonic() - killed:.1f}s after the kill; "
      f"STALL_AFTER {s.stall_after:g}s)")
    await d.until(f"(b) {victim} lost", states, both("lost"), s.lost_after + STEP_TIMEOUT_S)
    t(f"(b) {victim} lost ({time.monotonic() - killed:.1f}s after the kill; "
      f"LOST_AFTER {s.lost_after:g}s)")
    await d.until(f"(b) {task} lost",
                  lambda: d.fetchrow("SELECT state, stop_reason FROM reaper.tasks WHERE id = $1",
                                     task),
                  lambda r: r is not None and r["state"] == "lost", STEP_TIMEOUT_S)
    t(f"(b) task {task} lost (stop_reason worker-lost)")
    repl = await d.until(
        f"(b) replacement of {task} placed",
        lambda: d.fetchrow("SELECT id, worker, state FROM reaper.tasks WHERE replaces = $1", task),
        lambda r: r is not None, STEP_TIMEOUT_S)
    if repl["worker"] not in AGENTS or repl["worker"] == victim:
        raise DemoFailed(f"(b) replacement of {task} placed",
                         f"placed on {repl['worker']!r}, not on a surviving agent")
    new_id, target = repl["id"], repl["worker"]
    t(f"(b) replacement {new_id} (replaces {task}) placed on {target}")
    await d.until(f"(b) replacement {new_id} running",
                  lambda: d.fetchval("SELECT state FROM reaper.tasks WHERE id = $1", new_id),
                  lambda st: st == "running", STEP_TIMEOUT_S)
    if not (d.agent_dir(target) / "tasks" / new_id).exists():
        raise DemoFailed(f"(b) replacement {new_id} running", f"no entry in {target}'s tasks/")
    await d.until(f"(b) service {SERVICE} back at 3 running", lambda: _running(d),
                  lambda n: n == 3, STEP_TIMEOUT_S)
    t(f"(b) {target} started {new_id}: running; service {SERVICE} back at 3/3")


async def _running(d: Demo) -> int:
    return int(await d.fetchval(
        "SELECT count(*) FROM reaper.tasks WHERE service = $1 AND state = 'running'", SERVICE))


async def _step_return(d: Demo) -> None:
    """(c) The killed agent returns with a new boot id: its reaped task is an orphan."""
    t = d.timeline
    victim, task = "demo-b", f"{SERVICE}-2"
    old_boot = (await d.view(victim)).boot_id
    if not (d.agent_dir(victim) / "tasks" / task).exists():
        raise DemoFailed("(c) return", f"{victim} no longer holds {task} before its restart")
    d.start_agent(victim)
    t(f"(c) restarted agent {victim} (same state directory, still holding {task})")
    view = await d.until(f"(c) {victim} running with a new boot id", lambda: d.view(victim),
                         lambda v: v.state == "running" and v.boot_id != old_boot,
                         STEP_TIMEOUT_S)
    t(f"(c) {victim} running again, boot id {old_boot[:8]}… -> {view.boot_id[:8]}…")
    await d.until(f"(c) {task} in the orphans of {victim}", lambda: d.view(victim),
                  lambda v: task in v.orphans, STEP_TIMEOUT_S)
    t(f"(c) reaped task {task} listed in {victim}'s orphans")
    entry = d.agent_dir(victim) / "tasks" / task
    await d.until(f"(c) {victim} removed {task}", lambda: _async(entry.exists()),
                  lambda present: not present, STEP_TIMEOUT_S)
    t(f"(c) {victim} removed its entry for {task}")
    state = await d.fetchval("SELECT state FROM reaper.tasks WHERE id = $1", task)
    running = await _running(d)
    if state != "lost" or running != 3:
        raise DemoFailed("(c) no duplicate", f"{task} is {state!r}, {running} running tasks "
                                             f"in {SERVICE} (want lost and 3)")
    # One more full round of reports after the removal, to see that nothing comes back.
    seq = (await d.view(victim)).last_seq or 0
    await d.until(f"(c) {victim} reported after the removal", lambda: d.view(victim),
                  lambda v: (v.last_seq or 0) >= seq + 2, STEP_TIMEOUT_S)
    running = await _running(d)
    state = await d.fetchval("SELECT state FROM reaper.tasks WHERE id = $1", task)
    if state != "lost" or running != 3:
        raise DemoFailed("(c) no duplicate", f"{task} is {state!r}, {running} running tasks "
                                             f"in {SERVICE} (want lost and 3)")
    t(f"(c) no duplicate: {task} stays lost, exactly 3 running tasks in {SERVICE}")


async def _async(value: T) -> T:
    return value
