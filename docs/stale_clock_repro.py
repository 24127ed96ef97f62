"""A legacy query task makes a workflow decide on a stale ``workflow.now()`` (temporalio 1.35).

Self-contained; needs only ``temporalio`` and a Temporal server (``temporal server
start-dev``): ``python stale_clock_repro.py [timer|beat|none] [host:port]``.

W1, a child process, runs the workflow's tasks (beats are signalled until one reaches it
through its sticky queue); the last arms a 2 s timer, and W1 is SIGKILLed. A query sent then,
with no workflow task pending, is a legacy query task. It waits out W1's sticky queue while
the timer fires (``timer``) or a beat arrives (``beat``), and W2 takes it: its history ends
in TIMER_FIRED or SIGNALED with no new WORKFLOW_TASK_STARTED, and the workflow wakes with
``workflow.now()`` still at the previous task's start. W2 keeps what the workflow decided
there and sends it with the next real workflow task; a replay, on the recorded clock,
decides otherwise. Exit status 1: reproduced, the history does not replay; 0: it replays
(``none`` sends no query: the control).
"""

import asyncio
import sys
import uuid
from datetime import timedelta

from temporalio import workflow
from temporalio.api.enums.v1 import TaskQueueKind
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Replayer, Worker

STALL = 2.0


@workflow.defn
class Liveness:
    def __init__(self) -> None:
        self.beats, self.seen_beats, self.seen = 0, 0, []

    @workflow.signal
    def beat(self) -> None:
        self.beats += 1

    @workflow.query
    def state(self) -> list:
        return self.seen

    @workflow.run
    async def run(self) -> list:
        while True:  # wake on a beat or after STALL s; stalled if STALL s passed: done
            since, self.seen_beats = workflow.now(), self.beats
            try:
                await workflow.wait_condition(lambda: self.beats > self.seen_beats, timeout=STALL)
            except TimeoutError:
                pass
            silent = (workflow.now() - since).total_seconds()
            self.seen.append(f"woke {silent:.3f} s after {since:%H:%M:%S.%f}")
            if silent >= STALL:
                return self.seen


async def bound_to_w1(handle: WorkflowHandle) -> bool:
    """A task reached W1 through its sticky queue, and W1 is idle (its timer armed)."""
    events = (await handle.fetch_history()).events
    sticky = TaskQueueKind.TASK_QUEUE_KIND_STICKY
    return events[-1].HasField("timer_started_event_attributes") and any(
        e.workflow_task_scheduled_event_attributes.task_queue.kind == sticky for e in events
    )


async def main(race: str, address: str, queue: str = "") -> int:
    client = await Client.connect(address)
    if race == "w1":  # the first worker; a task for it waits 5 s on its sticky queue
        sticky = timedelta(seconds=5)
        w = Worker(
            client,
            task_queue=queue,
            workflows=[Liveness],
            sticky_queue_schedule_to_start_timeout=sticky,
        )
        await w.run()
    queue = f"stale-clock-{uuid.uuid4()}"
    w1 = await asyncio.create_subprocess_exec(sys.executable, __file__, "w1", address, queue)
    try:
        handle = await client.start_workflow(Liveness.run, id=queue, task_queue=queue)
        while not await bound_to_w1(handle):  # beats make tasks until one goes sticky
            await handle.signal(Liveness.beat)
            await asyncio.sleep(0.5)
    finally:
        w1.kill()  # as a host dies: the run stays bound to W1's sticky queue
    query = asyncio.create_task(handle.query(Liveness.state)) if race != "none" else None
    await asyncio.sleep(0.2)
    if race == "beat":
        await handle.signal(Liveness.beat)
    async with Worker(client, task_queue=queue, workflows=[Liveness]):  # W2
        if query is not None:
            print("the racing query answered:", await query)
        print("result:", await handle.result())
    history = await handle.fetch_history()
    replay = await Replayer(workflows=[Liveness]).replay_workflow(
        history, raise_on_replay_failure=False
    )
    print("replay:", replay.replay_failure or "the history replays")
    return 1 if replay.replay_failure else 0


if __name__ == "__main__":
    args = sys.argv[1:] + ["timer", "localhost:7233"][len(sys.argv) - 1 :]
    sys.exit(asyncio.run(main(*args)))
