"""A real container engine for tests: Podman's Docker API service on a unix socket.

Debian's ``podman`` and ``runc`` run real containers here as root; no registry is reachable,
so the image is made locally: a folder holding the static busybox of Debian's
``busybox-static`` (``/bin/busybox``, with ``sh``, ``sleep``, ``true`` links), tarred and
``podman import``-ed. Every test engine has its own storage (``--root``, ``--runroot``, the
``vfs`` driver) under a temporary directory, so it shares nothing with the host's Podman or
with another test run, and is wiped at the end.

Containers made here use what this machine needs: runtime ``runc``, network ``none``,
``nofile`` and ``nproc`` ulimits of 1024 (:func:`host_config`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from docker import APIClient
from docker.types import Ulimit

from reaper.cli.runtimes.engine import negotiate

IMAGE = "localhost/reaper-busybox:1"
"""The test image (the name deploy/agent-templates/web.toml uses)."""
BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "sleep", "true", "cat", "echo", "ls")
SLEEPER = ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 100000 & wait"]
"""A container's command that runs until SIGTERM and then exits at once (busybox sh as
PID 1 would otherwise ignore SIGTERM and wait for the grace period's SIGKILL)."""


def cannot_run() -> str | None:
    """Why this machine cannot run the engine tests, in one line; ``None`` if it can."""
    missing = [n for n in ("podman", "runc") if shutil.which(n) is None]
    if not BUSYBOX.exists():
        missing.append("busybox-static (/bin/busybox)")
    if missing:
        return f"no {', '.join(missing)}: `make sysdeps` installs podman, runc, busybox-static"
    if os.geteuid() != 0:
        return "the engine tests run containers as root (rootless Podman is not set up here)"
    return None


def host_config(api: APIClient, **extra: Any) -> dict[str, Any]:
    """A host config with runtime runc, network none and the 1024 ulimits, plus ``extra``."""
    return api.create_host_config(
        runtime="runc",
        network_mode="none",
        ulimits=[
            Ulimit(name="nofile", soft=1024, hard=1024),
            Ulimit(name="nproc", soft=1024, hard=1024),
        ],
        **extra,
    )


class Podman:
    """A Podman store of its own, its image, and its Docker API services (several may serve
    one store: each on its own socket, started and stopped by pid)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="reaper-podman-"))
        self.flags = [
            "--root",
            str(self.dir / "root"),
            "--runroot",
            str(self.dir / "run"),
            "--storage-driver",
            "vfs",
        ]
        self.services: dict[str, subprocess.Popen[bytes]] = {}

    def podman(self, *args: str, timeout: float = 120) -> str:
        """``podman <store flags> ARGS``; its output. Raises on a non-zero exit."""
        out = subprocess.run(
            ["podman", *self.flags, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def import_image(self) -> None:
        """Build :data:`IMAGE` from the static busybox (no registry needed)."""
        rootfs = self.dir / "rootfs"
        (rootfs / "bin").mkdir(parents=True)
        shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
        for applet in APPLETS:
            (rootfs / "bin" / applet).symlink_to("busybox")
        (rootfs / "tmp").mkdir()
        tar = self.dir / "rootfs.tar"
        with tarfile.open(tar, "w") as t:
            t.add(rootfs, arcname=".")
        self.podman("import", str(tar), IMAGE)

    def socket(self, name: str) -> Path:
        return self.dir / f"{name}.sock"

    def url(self, name: str) -> str:
        """The ``unix://`` URL of service ``name``."""
        return f"unix://{self.socket(name)}"

    def start_service(self, name: str = "api", deadline_s: float = 30) -> str:
        """Start ``podman system service`` on ``<dir>/<name>.sock``; its URL once it answers
        ``/_ping``."""
        sock = self.socket(name)
        sock.unlink(missing_ok=True)
        log = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115  (kept by the child)
        self.services[name] = subprocess.Popen(
            ["podman", *self.flags, "system", "service", "--time=0", f"unix://{sock}"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        give_up = time.monotonic() + deadline_s
        while True:
            try:
                if sock.exists() and self.api(name, timeout=2).ping():
                    return self.url(name)
            except Exception:
                pass
            if self.services[name].poll() is not None or time.monotonic() > give_up:
                log_text = (self.dir / f"{name}.log").read_text()
                raise RuntimeError(f"podman system service did not answer: {log_text}")
            time.sleep(0.05)

    def signal_service(self, name: str, sig: int) -> None:
        """Send ``sig`` to service ``name`` (SIGSTOP: it hangs; SIGCONT: it goes on)."""
        self.services[name].send_signal(sig)

    def stop_service(self, name: str = "api") -> None:
        """Stop service ``name`` by its pid (SIGTERM: it removes its socket; its containers
        keep running, conmon holds them)."""
        proc = self.services.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def kill_service(self, name: str) -> None:
        """SIGKILL service ``name``, as a crash: its socket file stays, and nothing listens
        on it (connection refused)."""
        proc = self.services.pop(name)
        proc.kill()
        proc.wait(10)

    def api(self, name: str = "api", timeout: float = 20) -> APIClient:
        """A docker-py client of service ``name``, its API version from ``/_ping`` as the
        agent's (``reaper.cli.runtimes.engine.negotiate``): docker-py's ``version="auto"``
        asks ``/version``, which Podman 4 answers by running its helpers, in over a second,
        and in more than 5 s on a loaded machine."""
        return negotiate(self.url(name), timeout)

    def close(self) -> None:
        """Stop every service, remove every container and volume of this store, delete it."""
        for name in list(self.services):
            self.stop_service(name)
        for args in (("rm", "--all", "--force", "--time", "0"), ("volume", "rm", "--all", "-f")):
            try:
                self.podman(*args)
            except Exception:
                pass
        # conmon runs `podman ... container cleanup` after each container's end, on this
        # store: let those finish first, or they recreate its lock files once it is gone.
        give_up = time.monotonic() + 15
        while time.monotonic() < give_up and self._helpers():
            time.sleep(0.1)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _helpers(self) -> list[int]:
        """Pids of processes that still use this store (conmon, podman cleanups)."""
        import psutil

        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if any(str(self.dir) in arg for arg in proc.info["cmdline"] or ()):
                found.append(proc.info["pid"])
        return found


def run(
    api: APIClient,
    labels: dict[str, str] | None,
    command: list[str] | None = None,
    binds: dict[str, dict[str, str]] | None = None,
    start: bool = True,
    name: str | None = None,
) -> str:
    """Create (and start) a container of :data:`IMAGE` as an operator would by hand; its id."""
    made = api.create_container(
        IMAGE,
        command=command or SLEEPER,
        labels=labels or {},
        name=name,
        host_config=host_config(api, binds=binds),
    )
    if start:
        api.start(made["Id"])
    return str(made["Id"])


def state_of(api: APIClient, ref: str) -> str | None:
    """A container's engine state, or ``None`` once it is gone."""
    import docker.errors

    try:
        return str(api.inspect_container(ref)["State"]["Status"])
    except docker.errors.NotFound:
        return None
    except docker.errors.APIError as exc:
        if "no such container" in str(exc.explanation):
            return None  # Podman answers 500 for a container it is removing
        raise


def volume_exists(api: APIClient, name: str) -> bool:
    """Whether volume ``name`` is there."""
    import docker.errors

    try:
        api.inspect_volume(name)
        return True
    except docker.errors.NotFound:
        return False


class FaultyProxy:
    """A unix-socket proxy in front of a real engine's socket that a test switches between
    ``pass`` (bytes go through), ``error`` (every request answered ``500``) and ``slow``
    (each connection held ``delay`` seconds before it goes through). A switch closes the
    open connections, so the client's pooled ones see it at once."""

    def __init__(self, upstream: Path, path: Path, delay: float = 3.0) -> None:
        self.upstream, self.path, self.delay = upstream, path, delay
        self.mode = "pass"
        self.server: asyncio.AbstractServer | None = None
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._serve, path=str(self.path))

    def switch(self, mode: str) -> None:
        self.mode = mode
        for w in list(self._open):
            w.close()
        self._open.clear()

    async def close(self) -> None:
        self.switch("pass")
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            if self.mode == "error":
                await reader.readuntil(b"\r\n\r\n")
                body = b'{"message": "injected fault"}'
                writer.write(
                    b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                return
            if self.mode == "slow":
                await asyncio.sleep(self.delay)
            up_reader, up_writer = await asyncio.open_unix_connection(str(self.upstream))
            self._open.add(up_writer)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._open.discard(writer)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until EOF, then close ``writer``."""
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()
