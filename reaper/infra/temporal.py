"""Connecting to Temporal: bounded retry, the pydantic converter, search attributes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.common import SearchAttributeIndexedValueType, SearchAttributeKey
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import CompositePayloadConverter, DataConverter, EncodingPayloadConverter
from temporalio.runtime import Runtime
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import (
    PollerBehaviorSimpleMaximum,
    UnsandboxedWorkflowRunner,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from reaper.core.contract import DEFAULT_ADDRESS
from reaper.infra.db import CONNECT_DEADLINE_S, with_backoff

log = logging.getLogger("reaper.temporal")

T = TypeVar("T")


class SharedPayloadConverter(PydanticPayloadConverter):
    """The pydantic payload converter (``temporalio.contrib.pydantic``), built once.

    The SDK builds a payload converter for every workflow activation and every command's
    serialization context: two a beat. The pydantic one builds a JSON serializer and an
    empty cache of type adapters each time, so every activation also rebuilt the type
    adapters of the types it decoded. This one takes the converters of a single instance,
    cache included (thread-safe: an ``lru_cache``), and encodes and decodes exactly as the
    pydantic converter does, so clients and agents with ``pydantic_data_converter`` read
    and write the same payloads. Issue 36: building converters took 3% of a controller's
    Python time under metric 1's beats (py-spy ``--gil``: ``DataConverter.__post_init__``).
    """

    _shared: ClassVar[tuple[EncodingPayloadConverter, ...] | None] = None

    def __init__(self) -> None:
        shared = SharedPayloadConverter._shared
        if shared is None:
            shared = tuple(PydanticPayloadConverter().converters.values())
            SharedPayloadConverter._shared = shared
        CompositePayloadConverter.__init__(self, *shared)


DATA_CONVERTER = DataConverter(payload_converter_class=SharedPayloadConverter)
"""The data converter of every reaper client and worker: pydantic's, built once
(:class:`SharedPayloadConverter`)."""

TRANSIENT = frozenset(
    {
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.RESOURCE_EXHAUSTED,
    }
)
"""Status codes of a call that may succeed once the server is back (a restart, a network
partition, a busy frontend)."""


def temporal_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` is Temporal's answer of a call that may succeed once the server is back:
    an :class:`RPCError` of a :data:`TRANSIENT` status, or the client's own "transport error"
    (status ``UNKNOWN``: the gRPC library's code for a connection that failed under the call,
    reset or closed; a replica restarting beside a busy dev server exited on it, chaos seed 3,
    2026-12-06)."""
    if not isinstance(exc, RPCError):
        return False
    return exc.status in TRANSIENT or (
        exc.status == RPCStatusCode.UNKNOWN and exc.message == "transport error"
    )


async def connect(
    address: str | None,
    namespace: str,
    *,
    deadline_s: float = CONNECT_DEADLINE_S,
    runtime: Runtime | None = None,
) -> Client:
    """Connect a client (:data:`DATA_CONVERTER`), retrying until ``deadline_s`` seconds.

    Args:
        address: ``host:port`` of the frontend; ``None`` means the embedded dev server.
        namespace: Temporal namespace.
        runtime: the SDK runtime (its metrics exporter); ``None`` for the default one.

    Raises:
        Unreachable: no connection within the deadline; the message names the address.
    """
    target = address or DEFAULT_ADDRESS
    return await with_backoff(  # the SDK raises RuntimeError for connection failures
        lambda: Client.connect(
            target, namespace=namespace, data_converter=DATA_CONVERTER, runtime=runtime
        ),
        lambda exc: True,
        f"Temporal at {target}",
        deadline_s=deadline_s,
    )


async def while_unavailable(
    call: Callable[[], Awaitable[T]], what: str, *, deadline_s: float = CONNECT_DEADLINE_S
) -> T:
    """Run ``call`` again while Temporal answers it with a transient error
    (:func:`temporal_unavailable`: the server restarting, unreachable or overloaded, or the
    connection lost under the call), backing off from 0.2 s to 5 s.

    A controller's start-up calls after :func:`connect` (search attributes, the fleet
    monitor's start) go through this: a dev server restarted while a replica starts made the
    replica exit with "tcp connect error" (chaos seed 7, 400 rounds, 2026-12-02).

    Args:
        call: the call to make, safe to repeat (a registration, a start with
            ``USE_EXISTING``).
        what: what the call does, for the log line of each retry.
        deadline_s: seconds after which the last transient error is raised as
            :class:`~reaper.infra.db.Unreachable`.

    Raises:
        Unreachable: still unavailable after ``deadline_s``.
        RPCError: any other error of the call, at once.
    """
    return await with_backoff(
        call,
        temporal_unavailable,
        f"Temporal for {what}",
        deadline_s=deadline_s,
    )


_INDEXED = {
    SearchAttributeIndexedValueType.KEYWORD: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    SearchAttributeIndexedValueType.INT: IndexedValueType.INDEXED_VALUE_TYPE_INT,
}


async def ensure_search_attributes(
    client: Client, keys: tuple[SearchAttributeKey, ...]
) -> list[str]:
    """Register the custom search attributes that are missing; returns the names added.

    Args:
        keys: the keys to register (``workflows.common.SEARCH_ATTRIBUTES``).

    An unregistered key makes every workflow task that upserts it fail (docs/platform-notes.md).
    """
    try:
        existing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
        known = set(existing.custom_attributes) | set(existing.system_attributes)
    except RPCError as exc:
        if exc.status is not RPCStatusCode.UNIMPLEMENTED:  # the time-skipping server
            raise
        known = set()
    missing = {k.name: _INDEXED[k.indexed_value_type] for k in keys if k.name not in known}
    if missing:
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
            )
        except RPCError as exc:
            if exc.status is not RPCStatusCode.ALREADY_EXISTS:
                raise
        log.info("registered search attributes %s", sorted(missing))
    return sorted(missing)


def workflow_runner(sandboxed: bool = True) -> WorkflowRunner:
    """The controller's workflow runner: the SDK's sandbox with every module passed through,
    or (``sandboxed=False``, ``REAPER_WORKFLOW_SANDBOX=false``, the default of ``serve``)
    no sandbox at all.

    The default sandbox imports each workflow module afresh for every workflow run: with two
    long-lived workflows per worker that cost about 220 KiB of memory and 60 ms of CPU per
    worker registered (issue 11; measured with 1,000 workers). Passed through, a worker
    costs about half of each. The sandbox's runtime checks (``datetime.now``, ``random``,
    I/O in workflow code) still apply; what is given up is re-importing, which only guards
    against module-level state and import-time side effects, which the workflow modules
    never have (docs/platform-notes.md). Without the sandbox those checks go too, and each
    activation costs about 1.3 to 1.8 ms less (issue 20, BENCHMARKS.md). The in-process
    controllers of ``tests/`` keep the SDK's default sandbox, so the suite still catches a
    workflow module that would need it.

    Args:
        sandboxed: run the workflows in the sandbox (modules passed through) or not.

    Returns:
        A ``SandboxedWorkflowRunner`` or an ``UnsandboxedWorkflowRunner``.
    """
    if not sandboxed:
        return UnsandboxedWorkflowRunner()
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_all_modules()
    )


SHARED_QUEUE_POLL_SHARE = 0.5
"""The fraction of a controller's workflow-task polls kept on the task queue all replicas
share (the SDK's ``nonsticky_to_sticky_poll_ratio``, 0.2 by default); the rest poll the
controller's own sticky queue, where the tasks of the workflows it has cached come. Every
new worker's first task comes from the shared queue, and a fleet that boots at once is
thousands of them: at the SDK's defaults (5 polls, one of them on the shared queue) 5,000
workers added at once registered in 131-132 s on two cores; 20 polls at 0.2 (4 shared) in
97-114 s, at 0.5 (10 shared, 10 sticky) in 72-97 s (BENCHMARKS.md metric 8b, issue 20). Half
keeps ten sticky polls for the steady beats, twice the SDK's four."""


def workflow_task_polling(pollers: int) -> dict[str, Any]:
    """The ``Worker`` arguments for ``pollers`` workflow-task polls at once
    (``REAPER_WORKFLOW_TASK_POLLERS``), :data:`SHARED_QUEUE_POLL_SHARE` of them on the shared
    task queue; the controller's and the bench's no-op worker's alike.

    Args:
        pollers: at least 2 (one per queue; the SDK raises ``ValueError`` below that).
    """
    return {
        "workflow_task_poller_behavior": PollerBehaviorSimpleMaximum(pollers),
        "nonsticky_to_sticky_poll_ratio": SHARED_QUEUE_POLL_SHARE,
    }


class InlineActivations(concurrent.futures.ThreadPoolExecutor):
    """The controller's ``workflow_task_executor``: each workflow activation runs at once on
    the thread that hands it over, the controller's event loop, instead of on the SDK's
    default thread pool (``REAPER_WORKFLOW_INLINE``).

    With the thread pool, every activation is a hand-off to a pool thread, a wait for the
    GIL, and a wake-up of the event loop through its self-pipe when it is done; with one
    Python thread doing all the work anyway (the GIL), those cost a controller about a
    fifth of its CPU per beat (metric 1 on 7 December: 2.62 ms a beat with the pool, 2.06
    ms inline, the no-op worker 1.66 and 1.57 ms; issue 36). What the pool
    gave is the SDK's deadlock detection: an activation still running after 2 s fails its
    workflow task. Inline, nothing interrupts an activation; reaper's workflows are its own
    code, and an activation slowed by a starved CPU (a CPU hog beside it, 4d) is no longer
    failed as deadlocked and run again.

    Each call runs in a copy of the caller's context variables, and the caller's running
    event loop is restored after it (an activation sets the workflow's own loop as the
    running one and clears it when done). Python 3.14 forbids stepping one asyncio task
    inside another's step on the same thread: there :func:`workflow_task_executor` returns
    ``None`` and the SDK's thread pool is used. A ``ThreadPoolExecutor`` by type only (what
    the SDK's ``Worker`` takes): it never starts a thread.
    """

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        """Run ``fn(*args, **kwargs)`` now; a future done with its result or exception."""
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        loop = asyncio.events._get_running_loop()
        try:
            done.set_result(contextvars.copy_context().run(fn, *args, **kwargs))
        except BaseException as exc:  # handed to the SDK, which fails the activation
            done.set_exception(exc)
        finally:
            asyncio.events._set_running_loop(loop)
        return done


def workflow_task_executor(inline: bool) -> concurrent.futures.ThreadPoolExecutor | None:
    """The ``Worker``'s ``workflow_task_executor`` for ``REAPER_WORKFLOW_INLINE``:
    :class:`InlineActivations`, or ``None`` (the SDK's thread pool) when not ``inline`` or
    on Python 3.14 and later."""
    return InlineActivations() if inline and sys.version_info < (3, 14) else None
