"""``reaper demo``'s steps: seed a service, then observe (a) a missing volume destroyed after
its TTL, (b) a killed agent reaped and its task replaced, (c) its return without a duplicate,
(d) a scale-in: an agent stopped with ``--retire-on-stop`` retires its worker and its task is
replaced at once, (e) a scale-out: work owed while no worker could take it is placed on a
new worker as soon as it joins.

Each step acts (deletes an entry, kills an agent, restarts it), then waits for each outcome
with :meth:`Demo.until`; reads of Postgres go through :mod:`reaper.cli.read`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import TypeVar

from reaper.cli import read, scheduler
from reaper.cli.demo import observe
from reaper.cli.demo.fleet_steps import step_scale_in, step_scale_out
from reaper.cli.demo.session import (
    AGENTS,
    LEAVING,
    SERVICE,
    STEP_TIMEOUT_S,
    Demo,
    DemoFailed,
)
from reaper.core.contract import KINDS
from reaper.core.policy.collection import destroy_after

T = TypeVar("T")

TTL_SLACK_S = 1.0
""""Just before the TTL": the row must still be present this close to its due time."""


async def run_steps(d: Demo) -> None:
    """Wait for the schema, seed, start the agents, see the service at 3/3, then (a)-(e).

    Raises:
        DemoFailed: an outcome was not observed; its step is named.
    """
    t = d.timeline
    await d.until(
        "controller ready (schema migrated)",
        lambda: read.schema_ready(d.db),
        lambda ready: ready,
        STEP_TIMEOUT_S,
    )
    t("controller ready: schema migrated")
    await seed(d)
    for name in AGENTS:
        d.start_agent(name, retire_on_stop=name == LEAVING)
    t(
        f"started agents {', '.join(AGENTS)} (one state directory each; "
        f"{LEAVING} with --retire-on-stop)"
    )

    for name in AGENTS:
        await d.until(
            f"{name} running", partial(d.view, name), lambda v: v.state == "running", STEP_TIMEOUT_S
        )
    t("all three workers running (liveness-demo-a/b/c)")
    for i, name in enumerate(AGENTS, start=1):
        task = f"{SERVICE}-{i}"
        await d.until(
            f"{task} running on {name}",
            partial(observe.task_state, d.db, task),
            lambda st: st == "running",
            STEP_TIMEOUT_S,
        )
        if not (d.agent_dir(name) / "tasks" / task).exists():
            raise DemoFailed(f"{task} running on {name}", "no entry in the agent's tasks/")
    t(f"tasks {SERVICE}-1..3 started by their agents and running: service {SERVICE} at 3/3")

    await step_missing_volume(d)
    await step_kill_agent(d)
    await step_return(d)
    await step_scale_in(d)
    await step_scale_out(d)


async def seed(d: Demo) -> None:
    """A service of 3, one pending task per agent, one container and one volume per agent
    (directory entries and ``created`` rows), in one transaction."""
    async with d.db.acquire() as conn, conn.transaction():
        await scheduler.add_service(conn, SERVICE, 3)
        for i, name in enumerate(AGENTS, start=1):
            base = d.agent_dir(name)
            for kind in KINDS:
                (base / kind).mkdir(parents=True, exist_ok=True)
            (base / "containers" / f"c-{name}").touch()
            (base / "volumes" / f"v-{name}").touch()
            await scheduler.add_handle(conn, "containers", f"c-{name}", name)
            await scheduler.add_handle(conn, "volumes", f"v-{name}", name)
            await scheduler.add_task(conn, f"{SERVICE}-{i}", SERVICE, name)
    d.timeline(
        f"seeded: service {SERVICE} (desired 3), pending tasks {SERVICE}-1..3 placed on "
        "demo-a/b/c, a container and a volume per agent (entries + rows 'created')"
    )


async def step_missing_volume(d: Demo) -> None:
    """(a) A volume entry disappears: destroyed once it has been missing as long as a volume
    waits (``policy.collection.destroy_after``: MISSING_TTL), not before."""
    t, ttl = d.timeline, destroy_after("volumes", d.settings.missing_ttl)
    step = "(a) missing volume destroyed after the TTL"
    worker, handle = "demo-a", "v-demo-a"
    (d.agent_dir(worker) / "volumes" / handle).unlink()
    t(f"(a) removed volume entry {handle} from {worker}")
    marked = await d.until(
        step,
        lambda: observe.handle_missing_since(d.db, "volumes", handle),
        lambda v: v is not None,
        STEP_TIMEOUT_S,
    )
    assert marked is not None
    due = marked + timedelta(seconds=ttl)
    t(f"(a) {handle} marked missing (missing_since set); due for destroy {ttl:g}s later")
    last_present: datetime | None = None
    deadline = time.monotonic() + ttl + STEP_TIMEOUT_S
    while True:
        now, present = await observe.handle_present(d.db, "volumes", handle)
        if not present:
            gone_at = now
            break
        last_present = now
        if time.monotonic() > deadline:
            raise DemoFailed(
                step, f"{handle} still present {ttl + STEP_TIMEOUT_S:g}s after it was marked"
            )
        await asyncio.sleep(0.1)
    event = await observe.destroyed_event(d.db, "volume", handle)
    if event is None:
        raise DemoFailed(step, f"no events row 'destroyed' for {handle}")
    if event.at < due:
        raise DemoFailed(step, f"destroyed at {event.at}, before its due time {due}")
    if last_present is None or last_present < due - timedelta(seconds=TTL_SLACK_S):
        raise DemoFailed(
            step,
            f"{handle} was not seen present just before its due time "
            f"(last seen {last_present}, due {due})",
        )
    present_for = (last_present - marked).total_seconds()
    late = (event.at - due).total_seconds()
    t(
        f"(a) {handle} still present {present_for:.1f}s after the mark (TTL {ttl:g}s); "
        f"destroyed {late:.1f}s after the TTL ran out, events row 'destroyed' "
        f"(reason {event.reason!r}); row gone {(gone_at - marked).total_seconds():.1f}s "
        "after the mark"
    )


async def step_kill_agent(d: Demo) -> None:
    """(b) SIGKILL an agent: stalled, lost, its task lost and replaced on a survivor."""
    t, s = d.timeline, d.settings
    victim, task = "demo-b", f"{SERVICE}-2"
    d.agents[victim].kill()
    killed = time.monotonic()
    t(f"(b) killed agent {victim} with SIGKILL (it held task {task})")

    def both(state: str) -> Callable[[tuple[str, str | None]], bool]:
        """The workflow's view and the ``workers`` row agree on ``state``."""
        return lambda v: v[0] == state and v[1] == state

    async def states() -> tuple[str, str | None]:
        view = await d.view(victim)
        return view.state, await observe.worker_state(d.db, victim)

    await d.until(f"(b) {victim} stalled", states, both("stalled"), s.stall_after + STEP_TIMEOUT_S)
    t(
        f"(b) {victim} stalled ({time.monotonic() - killed:.1f}s after the kill; "
        f"STALL_AFTER {s.stall_after:g}s)"
    )
    await d.until(f"(b) {victim} lost", states, both("lost"), s.lost_after + STEP_TIMEOUT_S)
    t(
        f"(b) {victim} lost ({time.monotonic() - killed:.1f}s after the kill; "
        f"LOST_AFTER {s.lost_after:g}s)"
    )
    await d.until(
        f"(b) {task} lost",
        lambda: observe.task(d.db, task),
        lambda r: r is not None and r.state == "lost",
        STEP_TIMEOUT_S,
    )
    t(f"(b) task {task} lost (stop_reason worker-lost)")
    repl = await d.until(
        f"(b) replacement of {task} placed",
        lambda: observe.replacement_of(d.db, task),
        lambda r: r is not None,
        STEP_TIMEOUT_S,
    )
    assert repl is not None
    if repl.worker not in AGENTS or repl.worker == victim:
        raise DemoFailed(
            f"(b) replacement of {task} placed",
            f"placed on {repl.worker!r}, not on a surviving agent",
        )
    new_id, target = repl.id, repl.worker
    t(f"(b) replacement {new_id} (replaces {task}) placed on {target}")
    await d.until(
        f"(b) replacement {new_id} running",
        lambda: observe.task_state(d.db, new_id),
        lambda st: st == "running",
        STEP_TIMEOUT_S,
    )
    if not (d.agent_dir(target) / "tasks" / new_id).exists():
        raise DemoFailed(f"(b) replacement {new_id} running", f"no entry in {target}'s tasks/")
    await d.until(
        f"(b) service {SERVICE} back at 3 running",
        lambda: observe.running_tasks_of(d.db, SERVICE),
        lambda n: n == 3,
        STEP_TIMEOUT_S,
    )
    t(f"(b) {target} started {new_id}: running; service {SERVICE} back at 3/3")


async def step_return(d: Demo) -> None:
    """(c) The killed agent returns with a new boot id: its reaped task is an orphan."""
    t = d.timeline
    victim, task = "demo-b", f"{SERVICE}-2"
    old_boot = (await d.view(victim)).boot_id
    if not (d.agent_dir(victim) / "tasks" / task).exists():
        raise DemoFailed("(c) return", f"{victim} no longer holds {task} before its restart")
    d.start_agent(victim)
    t(f"(c) restarted agent {victim} (same state directory, still holding {task})")
    view = await d.until(
        f"(c) {victim} running with a new boot id",
        lambda: d.view(victim),
        lambda v: v.state == "running" and v.boot_id != old_boot,
        STEP_TIMEOUT_S,
    )
    t(f"(c) {victim} running again, boot id {(old_boot or '')[:8]}… -> {(view.boot_id or '')[:8]}…")
    # The view lists the orphan only until the agent's next report (the agent removes it within
    # a beat), so a poll can miss it; the events row 'orphan' is the lasting record.
    await d.until(
        f"(c) {task} in the orphans of {victim}",
        lambda: read.events(d.db, worker=victim, kind="task", action="orphan"),
        lambda rows: any(r.handle == task for r in rows),
        STEP_TIMEOUT_S,
    )
    t(f"(c) reaped task {task} listed in {victim}'s orphans (events row 'orphan')")
    entry = d.agent_dir(victim) / "tasks" / task
    await d.until(
        f"(c) {victim} removed {task}",
        lambda: _now(entry.exists()),
        lambda present: not present,
        STEP_TIMEOUT_S,
    )
    t(f"(c) {victim} removed its entry for {task}")
    await _no_duplicate(d, task)
    # One more full round of reports after the removal, to see that nothing comes back.
    seq = (await d.view(victim)).last_seq or 0
    await d.until(
        f"(c) {victim} reported after the removal",
        lambda: d.view(victim),
        lambda v: (v.last_seq or 0) >= seq + 2,
        STEP_TIMEOUT_S,
    )
    await _no_duplicate(d, task)
    t(f"(c) no duplicate: {task} stays lost, exactly 3 running tasks in {SERVICE}")


async def _no_duplicate(d: Demo, task: str) -> None:
    """The reaped ``task`` is still ``lost`` and the service has exactly 3 running tasks."""
    state = await observe.task_state(d.db, task)
    running = await observe.running_tasks_of(d.db, SERVICE)
    if state != "lost" or running != 3:
        raise DemoFailed(
            "(c) no duplicate",
            f"{task} is {state!r}, {running} running tasks in {SERVICE} (want lost and 3)",
        )


async def _now(value: T) -> T:
    """``value`` as an awaitable, for a probe that needs no I/O."""
    return value
