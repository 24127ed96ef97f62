"""A workflow-task heartbeat makes the replay decide on a later ``workflow.now()`` than the live
run did (temporalio 1.35).

Self-contained; needs only ``temporalio`` and the ``temporal`` CLI on PATH (the project's venv
installs it), or a Temporal server: ``python wft_heartbeat_repro.py [query|timeout|none]
[host:port]``; without ``host:port`` it starts a dev server of its own.

The workflow's first task, run by a worker W1 that then stops, completes with no command (the
workflow waits for a beat). A beat is signalled and, in ``query``, the ``state`` query is sent:
the server holds the query for the workflow task the beat scheduled. W2 takes that task; its
activation reads ``workflow.now()`` (the task's start, T_A), starts a 1 s local activity, and
then answers the query. A query answer cannot wait for the local activity, so sdk-core
completes the task with no command and asks for a new one (a workflow-task heartbeat, started
at T_B); the activity's marker goes with that later task. ``timeout`` sends no query but
gives the workflow a 1 s task timeout: core heartbeats after 80% of it, 0.8 s. ``none`` does
neither: the control. The workflow records the clock it decided on in a patch id, the smallest
command that shows it. Replayed, the heartbeat task and its successor are one activation whose
``workflow.now()`` is T_B: another patch id, a nondeterminism. Exit status 1: reproduced, the
history does not replay; 0: it replays.
"""

import asyncio
import shutil
import sys
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker


@activity.defn
async def pause() -> None:
    await asyncio.sleep(1.0)


@workflow.defn
class Liveness:
    def __init__(self) -> None:
        self.beats, self.seen = 0, []

    @workflow.signal
    def beat(self) -> None:
        self.beats += 1

    @workflow.query
    def state(self) -> list:
        return self.seen

    @workflow.run
    async def run(self) -> list:
        await workflow.wait_condition(lambda: self.beats > 0)
        decided = workflow.now()  # what reaper compares with the last beat's time
        self.seen.append(f"decided at {decided:%H:%M:%S.%f}")
        await workflow.execute_local_activity(pause, start_to_close_timeout=timedelta(seconds=5))
        workflow.patched(f"decided-at-{decided:%H:%M:%S.%f}")
        return self.seen


TASKS = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED: "WORKFLOW_TASK_STARTED",
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: "WORKFLOW_TASK_COMPLETED",
    EventType.EVENT_TYPE_MARKER_RECORDED: "MARKER_RECORDED",
}


async def run(client: Client, case: str) -> int:
    queue = f"wft-heartbeat-{uuid.uuid4()}"
    task_timeout = timedelta(seconds=1 if case == "timeout" else 10)
    done = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    # W1 keeps no run cached, so the next task goes to the task queue, not to W1's sticky queue.
    async with Worker(client, task_queue=queue, workflows=[Liveness], max_cached_workflows=0):
        handle = await client.start_workflow(
            Liveness.run, id=queue, task_queue=queue, task_timeout=task_timeout
        )
        while not any(e.event_type == done for e in (await handle.fetch_history()).events):
            await asyncio.sleep(0.1)
    await handle.signal(Liveness.beat)  # no worker polls: the task it schedules waits
    query = asyncio.create_task(handle.query(Liveness.state)) if case == "query" else None
    await asyncio.sleep(0.5)  # the query reaches the server, which holds it for that task
    async with Worker(client, task_queue=queue, workflows=[Liveness], activities=[pause]):  # W2
        if query is not None:
            print("the query answered:", await query)
        print("result:", await handle.result())
    history = await handle.fetch_history()
    for e in history.events:
        if e.event_type in TASKS:
            print(f"{e.event_id:3} {e.event_time.ToDatetime():%H:%M:%S.%f} {TASKS[e.event_type]}")
    replay = await Replayer(workflows=[Liveness]).replay_workflow(
        history, raise_on_replay_failure=False
    )
    print("replay:", replay.replay_failure or "the history replays")
    return 1 if replay.replay_failure else 0


async def main(case: str, address: str = "") -> int:
    if address:
        return await run(await Client.connect(address), case)
    temporal = shutil.which("temporal")
    async with await WorkflowEnvironment.start_local(dev_server_existing_path=temporal) as env:
        return await run(env.client, case)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*(sys.argv[1:] or ["query"]))))
