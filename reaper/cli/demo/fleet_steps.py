"""``reaper demo``'s fleet steps: (d) a scale-in, an agent stopped with ``--retire-on-stop``
retires its worker and its task is replaced at once; (e) a scale-out, work owed while no
worker could take it is placed on a new worker as soon as it joins."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import TypeVar

from reaper.cli.demo import observe
from reaper.cli.demo.session import (
    AGENTS,
    JOINING,
    LEAVING,
    SERVICE,
    STEP_TIMEOUT_S,
    Demo,
    DemoFailed,
)

T = TypeVar("T")


async def step_scale_in(d: Demo) -> None:
    """(d) An agent stopped with ``--retire-on-stop``: its worker is retired, its tasks are
    lost (``worker-retired``) and replaced on a survivor at once, with no ``LOST_AFTER``."""
    t, s = d.timeline, d.settings
    step, victim = "(d) scale-in", LEAVING
    held = await observe.running_tasks_on(d.db, victim)
    if not held:
        raise DemoFailed(step, f"{victim} holds no running task before it leaves")
    stopped = time.monotonic()
    code = await d.stop_agent(victim)
    if code != 0:
        raise DemoFailed(step, f"agent {victim} exited {code} (its retire was not delivered?)")
    t(f"(d) stopped agent {victim} (SIGTERM): it sent retire and exited 0; it held {_ids(held)}")
    survivors = [a for a in AGENTS if a != victim]
    targets: dict[str, str] = {}
    for task in held:
        await d.until(
            f"{step}: {task} lost",
            partial(observe.task, d.db, task),
            lambda r: r is not None and r.state == "lost" and r.stop_reason == "worker-retired",
            STEP_TIMEOUT_S,
        )
        repl = await d.until(
            f"{step}: replacement of {task} placed",
            partial(observe.replacement_of, d.db, task),
            lambda r: r is not None and r.worker is not None,
            STEP_TIMEOUT_S,
        )
        assert repl is not None and repl.worker is not None
        if repl.worker not in survivors:
            raise DemoFailed(step, f"{repl.id} placed on {repl.worker!r}, not on a survivor")
        targets[repl.id] = repl.worker
        t(
            f"(d) task {task} lost (stop_reason worker-retired); replacement {repl.id} placed "
            f"on {repl.worker} {time.monotonic() - stopped:.1f}s after the SIGTERM "
            f"(no LOST_AFTER wait: it is {s.lost_after:g}s)"
        )
    await d.until(
        f"{step}: {victim} retired",
        lambda: observe.worker_state(d.db, victim),
        lambda st: st == "retired",
        STEP_TIMEOUT_S,
    )
    await d.until(
        f"{step}: liveness-{victim} completed",
        lambda: d.liveness_running(victim),
        lambda running: not running,
        STEP_TIMEOUT_S,
    )
    t(f"(d) workers row of {victim} 'retired'; liveness-{victim} completed")
    await _started(d, step, targets)
    await _at_desired(d, step)
    t(
        f"(d) {_ids(list(targets))} started by {_ids(sorted(set(targets.values())))}; "
        f"service {SERVICE} back at 3/3 on the two remaining workers"
    )


async def step_scale_out(d: Demo) -> None:
    """(e) Every remaining worker drained, one more retired: its replacements are owed; a new
    worker joins and the owed work is placed on it and started."""
    t = d.timeline
    step = "(e) scale-out with owed work"
    remaining = [a for a in AGENTS if a != LEAVING]
    leaving = remaining[0]  # demo-a: it has held web-1 since the start
    await asyncio.gather(
        *(d.cli(step, "drain", name, "--reason", "demo: scale-out") for name in remaining)
    )
    for name in remaining:
        await d.until(
            f"{step}: {name} draining",
            partial(d.view, name),
            lambda v: v.draining,
            STEP_TIMEOUT_S,
        )
    t(f"(e) reaper drain {' and '.join(remaining)}: both draining, no worker can take new work")
    held = await observe.running_tasks_on(d.db, leaving)
    if not held:
        raise DemoFailed(step, f"{leaving} holds no running task before it leaves")
    await d.cli(step, "retire", leaving, "--reason", "demo: scale-in")
    owed: list[str] = []
    for task in held:
        repl = await d.until(
            f"{step}: replacement of {task} owed",
            partial(observe.replacement_of, d.db, task),
            lambda r: r is not None,
            STEP_TIMEOUT_S,
        )
        assert repl is not None
        if repl.worker is not None or repl.state != "pending":
            raise DemoFailed(
                step, f"{repl.id} is {repl.state} on {repl.worker!r}, not owed (pending, no worker)"
            )
        owed.append(repl.id)
    await d.until(
        f"{step}: {leaving} retired",
        lambda: observe.worker_state(d.db, leaving),
        lambda st: st == "retired",
        STEP_TIMEOUT_S,
    )
    t(
        f"(e) reaper retire {leaving}: {_ids(held)} lost; replacement {_ids(owed)} owed "
        f"(pending, worker NULL); {leaving} retired"
    )
    code = await d.stop_agent(leaving)
    t(f"(e) stopped agent {leaving} (no --retire-on-stop; exited {code})")
    d.start_agent(JOINING)
    joined = time.monotonic()
    t(f"(e) started a new agent {JOINING} (fresh state directory)")
    for task_id in owed:
        await d.until(
            f"{step}: {task_id} placed on {JOINING}",
            partial(observe.task, d.db, task_id),
            lambda r: r is not None and r.worker is not None,
            STEP_TIMEOUT_S,
        )
        row = await observe.task(d.db, task_id)
        assert row is not None
        if row.worker != JOINING:
            raise DemoFailed(step, f"owed {task_id} placed on {row.worker!r}, not on {JOINING}")
    t(
        f"(e) owed {_ids(owed)} placed on {JOINING} "
        f"{time.monotonic() - joined:.1f}s after its agent started"
    )
    await _started(d, step, dict.fromkeys(owed, JOINING))
    await _at_desired(d, step)
    t(
        f"(e) {JOINING} started {_ids(owed)}: running; service {SERVICE} back at 3/3, "
        "exactly 3 active tasks"
    )


async def _started(d: Demo, step: str, placed: dict[str, str]) -> None:
    """Each task of ``placed`` (task id -> worker) is ``running`` and in its agent's tasks/."""
    for task_id, worker in placed.items():
        await d.until(
            f"{step}: {task_id} running",
            partial(observe.task_state, d.db, task_id),
            lambda st: st == "running",
            STEP_TIMEOUT_S,
        )
        if not (d.agent_dir(worker) / "tasks" / task_id).exists():
            raise DemoFailed(f"{step}: {task_id} running", f"no entry in {worker}'s tasks/")


async def _at_desired(d: Demo, step: str) -> None:
    """The service is back at 3 running tasks, and has exactly 3 active (none owed)."""
    await d.until(
        f"{step}: service {SERVICE} back at 3 running",
        lambda: observe.running_tasks_of(d.db, SERVICE),
        lambda n: n == 3,
        STEP_TIMEOUT_S,
    )
    active = await observe.active_tasks_of(d.db, SERVICE)
    if active != 3:
        raise DemoFailed(step, f"{active} active tasks in {SERVICE}, want exactly 3")


def _ids(ids: list[str]) -> str:
    return ", ".join(ids)
