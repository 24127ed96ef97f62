"""The controller as a child process: ``python worker.py`` with the settings it is given.

Its settings are ``REAPER_*`` variables (CONTRACT.md §1); those of this process's own
environment are not passed on, so a child runs with exactly what it was given (and the
defaults of ``reaper.core.config``).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from reaper.core.config import Settings
from reaper.kit.processes import Child, StackError, environment

if TYPE_CHECKING:
    from temporalio.client import Client

CONTROLLER_ENTRY_POINT = "reaper-controller"
"""The console script the package declares for the controller (``pyproject.toml``:
``reaper-controller = "worker:main"``, what ``python worker.py`` runs). The kit starts the
controller through this declaration, not by naming ``worker`` here: nothing of ``reaper``
imports the controller's entry point (an import-linter contract), and the dependency is
where the package says it, checked by tests/core/test_controller_entry.py."""


def controller_argv() -> tuple[str, ...]:
    """``python`` arguments that run the declared controller entry point (by module, so it
    works wherever the project is installed, and with an older release's own code first on
    ``PYTHONPATH``).

    Raises:
        StackError: the package declares no ``reaper-controller`` (not installed).
    """
    from importlib.metadata import entry_points

    found = entry_points(group="console_scripts", name=CONTROLLER_ENTRY_POINT)
    if not found:
        raise StackError(
            f"no {CONTROLLER_ENTRY_POINT} entry point: install the project (make, or pip"
            " install -e .)"
        )
    module, _, func = next(iter(found)).value.partition(":")
    return ("-c", f"import sys, {module}; sys.exit({module}.{func}())")


BAD_CONFIG_EXIT = 2
"""``worker.main`` exits with this on a bad configuration: restarting would not help."""
POLLING_TIMEOUT_S = 60.0
"""How long a controller may take to poll its task queue after its start (migrations, the
fleet monitor's start, a loaded machine)."""


def settings_env(settings: Settings) -> dict[str, str]:
    """Every setting of ``settings`` as its ``REAPER_*`` variable (durations in seconds,
    booleans ``true``/``false``, lists comma-separated); unset ones are left out."""
    env: dict[str, str] = {}
    for name, value in settings.model_dump(mode="json").items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, list):  # operator keys
            value = ",".join(value)
        env[f"REAPER_{name.upper()}"] = str(value)
    return env


class Controller(Child):
    """``python worker.py`` on a Temporal frontend, a database and a task queue.

    Args:
        address: ``host:port`` of the Temporal frontend (``REAPER_TEMPORAL_ADDRESS``).
        database_url: its ``postgresql://`` URL (``REAPER_DATABASE_URL``).
        task_queue: its task queue; another controller's to be its replica; a fresh
            ``tq-...`` when ``None``.
        settings: further ``REAPER_*`` variables (timings, ports, ``REAPER_STATE_DIR``).
        log_path: file for its output; ``None`` shows it on the terminal.
        name: shown in messages.
        restart: :meth:`check` restarts it when it exits (not after a bad configuration).
        argv: the command after ``python``; the declared controller entry point
            (:func:`controller_argv`) unless given.
        cwd: its working directory (where it reads a ``.env`` file).
    """

    def __init__(
        self,
        address: str,
        database_url: str,
        *,
        task_queue: str | None = None,
        settings: Mapping[str, str] = {},
        log_path: Path | None = None,
        name: str = "controller",
        restart: bool = False,
        argv: Sequence[str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.address = address
        self.database_url = database_url
        self.task_queue = task_queue or f"tq-{uuid.uuid4().hex[:8]}"
        self.settings = dict(settings)
        env = environment(
            {
                **self.settings,
                "REAPER_TEMPORAL_ADDRESS": address,
                "REAPER_DATABASE_URL": database_url,
                "REAPER_TASK_QUEUE": self.task_queue,
                "PYTHONUNBUFFERED": "1",
            }
        )
        super().__init__(
            name,
            [sys.executable, *(argv if argv is not None else controller_argv())],
            env,
            log_path=log_path,
            restart=restart,
            fatal_codes=frozenset({BAD_CONFIG_EXIT}),
            cwd=cwd,
        )

    async def until_polling(self, client: Client, timeout: float = POLLING_TIMEOUT_S) -> None:
        """Return once it polls its task queue (its schema migrated, its fleet monitor
        started): :func:`until_polled`."""
        await until_polled(client, self.task_queue, self, timeout)


async def until_polled(
    client: Client, task_queue: str, child: Child, timeout: float = POLLING_TIMEOUT_S
) -> None:
    """Return once a worker polls ``task_queue`` for workflow tasks.

    Raises:
        StackError: ``child`` (the worker's process) exited, or nothing polled within
            ``timeout`` seconds.
    """
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
    from temporalio.service import RPCError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            raise StackError(f"{child.name} exited" + child.log_hint())
        try:
            resp = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=client.namespace,
                    task_queue=TaskQueue(name=task_queue),
                    task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
                )
            )
            if resp.pollers:
                return
        except RPCError:
            pass
        await asyncio.sleep(0.2)
    raise StackError(f"no worker polled {task_queue} within {timeout:g}s" + child.log_hint())
