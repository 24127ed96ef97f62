"""How a history is replayed on this code: the controller's repair of a stuck liveness
(``activities/repair.py``) and ``reaper upgrade-check`` ask the same question, "would this
release take over that run?", the same way."""

from __future__ import annotations

from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.worker import Replayer

from activities.diagnosis import ReplayCheck
from reaper.infra.temporal import workflow_runner
from workflows import ALL_WORKFLOWS


def replay_check(runtime: Runtime | None = None, sandboxed: bool = True) -> ReplayCheck:
    """How the repair of a stuck liveness (``activities/repair.py``) tells whether a history
    replays on this controller's code: the SDK's ``Replayer`` with ``ALL_WORKFLOWS``, the
    pydantic data converter and the controller's workflow runner, as ``serve`` runs them.

    Args:
        runtime: the SDK runtime of the controller's client (one runtime per process); the
            SDK's default when ``None``.
        sandboxed: replay in the sandbox (``REAPER_WORKFLOW_SANDBOX``; the tests' default).

    Returns:
        An async function of a ``WorkflowHistory``: ``None`` if it replays cleanly, else
        the replay's failure (``temporalio.workflow.NondeterminismError`` for a
        nondeterminism). Replays run in the SDK's replay worker, one at a time per call.
    """
    replayer = Replayer(
        workflows=ALL_WORKFLOWS,
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(sandboxed),
        runtime=runtime,
    )

    async def replay(history: WorkflowHistory) -> BaseException | None:
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        return result.replay_failure

    return replay
