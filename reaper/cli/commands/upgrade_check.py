"""``reaper upgrade-check``: would this release take over every run the fleet's controllers
are running now?

A release takes over only from the release before it, and only once that release's
controllers have run at their own line's ``REAPER_PEER_VERSION`` long enough that every run
started since (CHANGELOG.md, "Upgrade"): a run recorded under an older line holds commands
this release no longer gives. Run this release's ``reaper upgrade-check`` against the fleet
before rolling it out. It lists the running ``WorkerLiveness``, ``HandleCollector``,
``WorkerReap`` and ``FleetMonitor`` runs of the task queue, fetches each history and replays
it on this release's workflow code (``workflows.replay``, as the controller's repair does):
a run that does not replay is one this release could not serve. Reads only.

Exit status: 0 every run replays; 1 some do not (each named, with the first line of why), or
Temporal could not be read; 2 a bad configuration.
"""

from __future__ import annotations

import asyncio
from typing import Any

from reaper.cli.app import (
    ADDRESS_OPTION,
    NAMESPACE_OPTION,
    TASK_QUEUE_OPTION,
    CliError,
    app,
    connect_temporal,
    connection_settings_from,
    console,
    exit_now,
    fail,
    progress,
)

PARALLEL = 8
"""Histories fetched and replayed at once (one replay runs at a time in the SDK's replay
worker; fetching is what overlaps)."""
TYPES = ("WorkerLiveness", "HandleCollector", "WorkerReap", "FleetMonitor")
"""The workflow types reaper runs (``workflows.ALL_WORKFLOWS``)."""


@app.command("upgrade-check", short_help="Check that this release can take over every running run.")
def upgrade_check(
    address: str | None = ADDRESS_OPTION,
    namespace: str | None = NAMESPACE_OPTION,
    task_queue: str | None = TASK_QUEUE_OPTION,
) -> None:
    """Replay every running reaper workflow of the task queue on this release's code and say
    which would not be taken over (run it before a rolling upgrade; CHANGELOG.md, Upgrade).
    Exits 1 if any would not."""
    try:
        settings = connection_settings_from(
            temporal_address=address, namespace=namespace, task_queue=task_queue
        )
        checked, failed = asyncio.run(_check(settings))
    except CliError as exc:
        fail(exc)
    for workflow_id, why in failed:
        console.print(f"not replayable  {workflow_id}  {why}", highlight=False, markup=False)
    verdict = "ready" if not failed else f"not ready: {len(failed)} would fail"
    console.print(
        f"{checked} running runs checked on task queue {settings.task_queue!r}: {verdict}",
        highlight=False,
        markup=False,
    )
    exit_now(1 if failed else 0)


async def _check(settings: Any) -> tuple[int, list[tuple[str, str]]]:
    """``(runs checked, [(workflow id, first line of its replay failure)])``."""
    from temporalio.service import RPCError

    from workflows.replay import replay_check

    if "'" in settings.task_queue or "\\" in settings.task_queue:
        raise CliError(f"a task queue name with quotes cannot be listed: {settings.task_queue!r}")
    client = await connect_temporal(settings)
    types = " OR ".join(f"WorkflowType = '{t}'" for t in TYPES)
    query = f"ExecutionStatus = 'Running' AND TaskQueue = '{settings.task_queue}' AND ({types})"
    replay = replay_check(client.service_client.config.runtime, sandboxed=False)
    gate = asyncio.Semaphore(PARALLEL)
    failed: list[tuple[str, str]] = []

    async def one(workflow_id: str, run_id: str) -> None:
        async with gate:
            history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
            failure = await replay(history)
        if failure is not None:
            failed.append((workflow_id, str(failure).splitlines()[0][:200]))

    try:
        with progress("listing and replaying the running runs…"):
            runs = [(wf.id, wf.run_id) async for wf in client.list_workflows(query)]
            await asyncio.gather(*(one(w, r) for w, r in runs))
    except RPCError as exc:
        raise CliError(f"Temporal could not be read: {exc}") from None
    return len(runs), sorted(failed)
