"""The controller's workflow activations run inline on its event loop
(``reaper.infra.temporal.InlineActivations``, ``REAPER_WORKFLOW_INLINE``): what the SDK's
thread pool gave an activation, the inline executor gives too, and the caller's event loop
is left as it was."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import threading

import pytest

from reaper.infra.temporal import InlineActivations, workflow_task_executor

MARK: contextvars.ContextVar[str] = contextvars.ContextVar("mark", default="caller")


async def test_an_activation_runs_at_once_on_the_event_loop_thread():
    loop = asyncio.get_running_loop()
    ran_on: list[threading.Thread] = []

    def activation(x: int) -> int:
        ran_on.append(threading.current_thread())
        return x + 1

    future = loop.run_in_executor(InlineActivations(), activation, 41)
    assert ran_on == [threading.current_thread()]  # before the caller awaited anything
    assert await future == 42


async def test_a_failing_activation_hands_its_exception_to_the_caller():
    def activation() -> None:
        raise RuntimeError("nondeterminism")

    with pytest.raises(RuntimeError, match="nondeterminism"):
        await asyncio.get_running_loop().run_in_executor(InlineActivations(), activation)


async def test_the_callers_running_loop_is_restored_after_an_activation_clears_it():
    loop = asyncio.get_running_loop()

    def activation() -> None:
        # What the SDK's workflow instance does at the end of every activation.
        asyncio.events._set_running_loop(None)

    await loop.run_in_executor(InlineActivations(), activation)
    assert asyncio.get_running_loop() is loop
    await asyncio.sleep(0)  # the loop still runs tasks


async def test_an_activation_sets_no_context_variable_of_the_caller():
    def activation() -> str:
        MARK.set("workflow")
        return MARK.get()

    assert await asyncio.get_running_loop().run_in_executor(InlineActivations(), activation) == (
        "workflow"
    )
    assert MARK.get() == "caller"


def test_the_setting_chooses_inline_or_the_sdks_thread_pool():
    assert workflow_task_executor(False) is None
    inline = workflow_task_executor(True)
    if sys.version_info >= (3, 14):
        assert inline is None  # nested task steps are refused there
    else:
        assert isinstance(inline, InlineActivations)
