"""``reaper events``: the ``reaper.events`` timeline (CONTRACT.md §3), filtered, and followed.

Rows are read through :mod:`reaper.cli.read` (the shell's read model); this module holds no
SQL. ``--follow`` polls for new rows every :data:`FOLLOW_POLL_S` seconds until Ctrl-C or
SIGTERM, which end it with status 0; :class:`reaper.cli.follow.FollowWindow` keeps it from
missing a row whose transaction committed after a newer one.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import typer

from reaper.cli.app import (
    DATABASE_URL_OPTION,
    STATE_DIR_OPTION,
    CliError,
    app,
    connection_settings_from,
    console,
    err,
    exit_now,
    fail,
)
from reaper.cli.commands.workers import find_database_url
from reaper.cli.follow import FollowWindow
from reaper.core import kinds
from reaper.core.config import ConfigError
from reaper.core.config_values import parse_duration

if TYPE_CHECKING:
    from reaper.cli import read

FOLLOW_POLL_S = 1.0
"""``--follow`` asks Postgres for new rows this often (seconds)."""
KINDS = (*kinds.WORDS, "worker")
"""``events.kind`` values (CONTRACT.md §3; ``reaper.core.kinds``)."""
_ACTION_STYLE = {
    "destroyed": "red",
    "lost": "red",
    "stopped": "yellow",
    "orphan": "magenta",
    "replaced": "green",
    "placed": "green",
    "state": "cyan",
}


def parse_when(value: str | None, now: datetime, flag: str) -> datetime | None:
    """A time bound from the command line: a duration back from ``now`` (``10m``, ``90``,
    ``1h30m``) or an ISO 8601 time (UTC if it names no zone); ``None`` if not given.

    Raises:
        CliError: neither form (the message names ``flag``).
    """
    if value is None:
        return None
    try:
        return now - timedelta(seconds=parse_duration(value))
    except (ConfigError, ValueError, TypeError):
        pass
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise CliError(
            f"{flag} {value!r}: give a duration such as 10m or 2h, or an ISO time such as "
            "2026-12-01T18:00:00Z",
            code=2,
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def as_json(e: read.Event) -> dict[str, Any]:
    """An events row as a JSON-ready dict (``at`` in ISO 8601)."""
    return {**e._asdict(), "at": e.at.isoformat()}


CONTROLLER_ACTOR = "reaper"
"""``events.actor`` of what the controller did on its own (``NULL`` too: most of its rows
carry none)."""


def line(e: read.Event) -> str:
    """An events row as one line of rich markup: time (UTC, as every table prints it),
    worker, kind, action, handle, reason, and ``(by ACTOR)`` when someone other than the
    controller acted (an operator, an agent): the controller's own rows, with actor
    ``reaper`` or none, carry no such mark."""
    from reaper.core.policy.explain import clock

    style = _ACTION_STYLE.get(e.action.removeprefix("would-"), "")
    action = f"[{style}]{e.action}[/]" if style else e.action
    text = f"{clock(e.at.astimezone(UTC))}  {e.worker or '-'}  {e.kind} {action}"
    if e.handle and e.handle != e.worker:
        text += f" {e.handle}"
    if e.reason:
        text += f"  [dim]{e.reason}[/]"
    if e.actor and e.actor != CONTROLLER_ACTOR:
        text += f"  [dim](by {e.actor})[/]"
    return text


def show(rows: list[read.Event], json_lines: bool) -> None:
    """Print rows, one line (or one JSON object) each, flushed at once."""
    for e in rows:
        if json_lines:
            print(json.dumps(as_json(e)), flush=True)
        else:
            console.print(line(e), highlight=False, markup=True)


async def timeline(url: str, filters: dict[str, Any], limit: int, follow: bool, js: bool) -> None:
    """Print the matching rows, then (``follow``) the new ones as they arrive.

    Raises:
        CliError: Postgres is unreachable or the schema is not there yet.
    """
    from reaper.cli import read

    try:
        conn = await read.open_connection(url, timeout_s=5)
    except Exception as exc:
        raise CliError(f"Postgres unreachable at {url.split('@')[-1]}: {exc}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if not await read.schema_ready(conn):
            raise CliError("no reaper schema in this database yet (has the controller started?)")
        # The floor before the rows: a row committed between the two reads is then above
        # it and followed, where a floor read after printing skipped it for ever (a fresh
        # clone's test_events_cli under load, 2026-12-05).
        window = FollowWindow(await _last_id(conn))
        rows = await read.events(conn, limit=limit or None, **filters)
        show(rows, js)
        if not rows:
            no_events(filters, follow, js)
        window.fresh(r.id for r in rows)  # printed already
        while follow and not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), FOLLOW_POLL_S)
            except TimeoutError:
                pass
            # Committed ids first: a row committed after this read waits for the next poll.
            committed = await read.event_ids_after(conn, window.floor)
            rows = await read.events(conn, after_id=window.floor, **filters)
            new = set(window.fresh(r.id for r in rows))
            show([r for r in rows if r.id in new], js)
            window.advance(committed, time.monotonic())
    finally:
        await conn.close()


def no_events(filters: dict[str, Any], follow: bool, json_lines: bool) -> None:
    """Say that nothing matched, in one line: ``no events`` and the filters that applied
    (``--follow``: and that new ones will be printed). On standard error with ``--json``,
    whose standard output stays JSON lines only."""
    given = [
        f"{name} {value.isoformat() if isinstance(value, datetime) else value}"
        for name, value in filters.items()
        if value is not None
    ]
    text = "no events" + (f" ({', '.join(given)})" if given else "")
    if follow:
        text += "; waiting for new ones (Ctrl-C to stop)"
    (err if json_lines else console).print(text, highlight=False, markup=False)


async def _last_id(conn: Any) -> int:
    """Follow from the newest row of any kind: what is printed already is at or below it."""
    from reaper.cli import read

    newest = await read.events(conn, limit=1)
    return newest[-1].id if newest else 0


@app.command(short_help="The events timeline: destroys, reaps, state changes and orphans.")
def events(
    worker: str | None = typer.Option(None, "--worker", metavar="NAME", help="Only this worker."),
    kind: str | None = typer.Option(
        None,
        "--kind",
        metavar="KIND",
        help=f"Only this kind: {kinds.spoken(*kinds.WORDS, 'worker')}.",
    ),
    action: str | None = typer.Option(
        None,
        "--action",
        metavar="ACTION",
        help="Only this action, such as destroyed, lost, replaced, state or orphan.",
    ),
    since: str | None = typer.Option(
        None,
        "--since",
        metavar="WHEN",
        help="Only rows at or after WHEN: a duration back from now (10m, 2h) or an ISO time.",
    ),
    until: str | None = typer.Option(
        None, "--until", metavar="WHEN", help="Only rows at or before WHEN (as --since)."
    ),
    limit: int = typer.Option(
        100, "--limit", metavar="N", help="Show the newest N matching rows; 0 shows them all."
    ),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Keep printing new rows as they arrive, until Ctrl-C."
    ),
    json_lines: bool = typer.Option(False, "--json", help="Print one JSON object per line."),
    database_url: str | None = DATABASE_URL_OPTION,
    state_dir: str | None = STATE_DIR_OPTION,
) -> None:
    """The timeline of reaper.events, oldest first: every destroy, stop, reap, replacement,
    state change, drain and orphan, with its worker, handle, reason and actor. Filters
    combine; --follow keeps printing new rows until Ctrl-C."""
    try:
        if kind is not None and kind not in KINDS:
            raise CliError(f"--kind {kind!r}: use one of {', '.join(KINDS)}", code=2)
        if limit < 0:
            raise CliError("--limit must be 0 or more", code=2)
        now = datetime.now(UTC)
        filters = {
            "worker": worker,
            "kind": kind,
            "action": action,
            "since": parse_when(since, now, "--since"),
            "until": parse_when(until, now, "--until"),
        }
        settings = connection_settings_from(database_url=database_url, state_dir=state_dir)
        url = find_database_url(settings)
        if url is None:
            raise CliError(
                "Postgres not found: the embedded one is not running under "
                f"{settings.state_dir} (is `reaper run` running? otherwise set "
                "REAPER_DATABASE_URL or --database-url)"
            )
        asyncio.run(timeline(url, filters, limit, follow, json_lines))
    except CliError as exc:
        fail(exc)
    except Exception as exc:
        fail(CliError(f"events: {str(exc).splitlines()[0] if str(exc) else repr(exc)}"))
    exit_now(0)
