"""``reaper explain``: which rule holds a worker or a handle of any kind (``reaper.core.kinds``)
where it is, and when it next falls due (``reaper.core.policy.explain``)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import typer

from reaper.cli.app import (
    ADDRESS_OPTION,
    DATABASE_URL_OPTION,
    NAMESPACE_OPTION,
    STATE_DIR_OPTION,
    CliError,
    PlainArgumentsCommand,
    app,
    console,
    exit_now,
    fail,
    settings_from,
)
from reaper.core import kinds
from reaper.core.config import Settings

KINDS = ("worker", *kinds.WORDS)
"""What ``reaper explain`` explains: a worker, or a handle of a kind (``reaper.core.kinds``)."""
QUERY_TIMEOUT_S = 5.0
"""Deadline of the liveness ``state`` query that freshens a worker's last heartbeat."""

_THINGS = kinds.spoken("worker", *kinds.WORDS)
"""What ``reaper explain`` explains: ``worker, container, volume or task``."""


async def _controller_view(settings: Settings, worker: str) -> tuple[Any, Any, str | None]:
    """The worker's liveness's ``state`` and ``deadlines`` answers (its last heartbeat and
    state, which the row may lag, §5.3; the controller's timings and outage grace), or
    ``(None, None, note)`` if Temporal does not answer (the ``deadlines`` answer is ``None``
    from a release that has no such query)."""
    from reaper.cli.agent_connection import query_state
    from reaper.cli.app import connect_temporal
    from reaper.core.contract import liveness_id
    from reaper.core.models import DeadlinesView

    try:
        client = await connect_temporal(settings)
        handle = client.get_workflow_handle(liveness_id(worker))
        view = await query_state(handle, QUERY_TIMEOUT_S)
    except (CliError, Exception) as exc:
        return None, None, f"liveness not asked ({str(exc).splitlines()[0][:120]}): Postgres only"
    try:
        clock = await asyncio.wait_for(
            handle.query("deadlines", result_type=DeadlinesView), QUERY_TIMEOUT_S
        )
    except Exception:
        clock = None
    return view, clock, None


async def explain_one(
    settings: Settings, kind: str | None, name: str, live: bool = True
) -> dict[str, Any]:
    """The explanation of ``kind`` ``name`` as a JSON-ready dict (with ``history``, its
    newest events, and ``notes`` on what could not be read). With ``kind`` ``None``, the
    kind whose table (or, for a thing gone, whose events) holds ``name``; when several do,
    the first of :data:`KINDS`, with a note naming the others.

    Raises:
        CliError: Postgres is unreachable, ``kind`` is not one of :data:`KINDS`, or no
            ``kind`` was given and nothing is named ``name``.
    """
    from reaper.cli import facts, read
    from reaper.cli.commands.workers import find_database_url
    from reaper.core.models import Timings
    from reaper.core.policy import explain, explain_drain, explain_rows

    if kind is not None and kind not in KINDS:
        raise CliError(f"explain: KIND must be one of {', '.join(KINDS)}, not {kind!r}", 2)
    url = find_database_url(settings)
    if url is None:
        raise CliError("explain: no database (is `reaper run` running? or set --database-url)")
    import asyncpg

    conn = await asyncpg.connect(url, timeout=5)
    notes: list[str] = []
    try:
        if kind is None:
            found = await facts.kinds_named(conn, name)
            if not found:
                raise CliError(f"explain: nothing is named {name!r} (no {_THINGS}, and no events)")
            kind = found[0]
            if len(found) > 1:
                others = ", ".join(f"`reaper explain {k} {name}`" for k in found[1:])
                notes.append(f"{name!r} also names a {', a '.join(found[1:])}: {others}")
        now = await facts.database_now(conn)
        fleet = await facts.fleet_facts(conn)
        history = await facts.events_of(conn, kind, name)
        t, grace, shell = Timings.of(settings), None, True
        if kind == "worker":
            w = await facts.worker_facts(conn, name)
            owner_name = w.name if w is not None else None
        else:
            row = await facts.row_facts(conn, kind, name)
            owner_name = row.worker if row is not None else None
        view = clock = None
        if live and owner_name is not None:
            view, clock, note = await _controller_view(settings, owner_name)
            notes += [note] if note else []
        if clock is not None and clock.timings is not None:
            t, grace, shell = clock.timings, clock.grace_until, False
        if kind == "worker":
            if w is None:
                e = explain_rows.explain_gone("worker", name, history)
            else:
                if view is not None:
                    last = view.last_heartbeat_at or w.last_heartbeat_at
                    w = replace(w, state=view.state, last_heartbeat_at=last)
                e = explain.explain_worker(w, fleet, t, now, grace)
                drain = await read.drain_state(conn, name)
                if drain is not None and drain.draining:
                    rows = await read.migration_rows(conn, name, None)
                    e.notes += explain_drain.explain_drain(
                        drain.migrate_until, drain.drained_at, rows, now
                    )
        else:
            if row is None:
                e = explain_rows.explain_gone(kind, name, history)
            else:
                owner = await facts.worker_facts(conn, row.worker) if row.worker else None
                if owner is not None and view is not None:
                    last = view.last_heartbeat_at or owner.last_heartbeat_at
                    owner = replace(owner, state=view.state, last_heartbeat_at=last)
                e = explain_rows.explain_row(row, owner, fleet, t, now, grace)
    finally:
        await conn.close()
    out = e.as_dict()
    out["history"] = explain_rows.history(history)
    out["notes"] += notes
    out["timings"] = (
        "as this shell's settings say (REAPER_* and .env): the controller did not say"
        if shell
        else "the controller's (its liveness's deadlines query)"
    )
    return out


def print_explanation(out: dict[str, Any]) -> None:
    """The explanation as a few plain lines."""
    console.print(f"[bold]{out['subject']}[/] is {out['state']}: {out['because']}", highlight=False)
    if out["next"]:
        console.print(f"  next: {out['next']}", highlight=False)
    for note in out["notes"]:
        console.print(f"  note: {note}", highlight=False)
    if out["history"]:
        console.print("  history:", highlight=False)
        for line in out["history"]:
            console.print(f"    {line}", highlight=False)


@app.command(
    short_help=f"Why a {_THINGS} is where it is, and what is next.",
    cls=PlainArgumentsCommand,
)
def explain(
    kind: str = typer.Argument(
        ...,
        metavar="[KIND] NAME",
        help=f"KIND: {_THINGS} (left out, the kind NAME names); NAME: its name, handle or task id.",
        show_default=False,
    ),
    name: str | None = typer.Argument(None, hidden=True),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    address: str | None = ADDRESS_OPTION,
    namespace: str | None = NAMESPACE_OPTION,
    database_url: str | None = DATABASE_URL_OPTION,
    state_dir: str | None = STATE_DIR_OPTION,
) -> None:
    """Which rule holds KIND NAME where it is and when it next falls due, with its latest
    events: "w3 is stalled: no heartbeat since 12:03:31; next: lost at 12:04:31 unless it
    beats". Without KIND, the thing NAME names (reaper explain web-2-c). Times are UTC,
    judged on Postgres' clock with the controller's timings and outage grace (asked of the
    worker's liveness; this shell's REAPER_* settings if it does not answer)."""
    what: str | None = kind
    if name is None:  # one argument: it is the NAME
        what, name = None, kind
    try:
        settings = settings_from(
            temporal_address=address,
            namespace=namespace,
            database_url=database_url,
            state_dir=state_dir,
        )
        out = asyncio.run(explain_one(settings, what, name))
    except CliError as exc:
        fail(exc)
    except Exception as exc:
        fail(CliError(f"explain: {str(exc).splitlines()[0] if str(exc) else repr(exc)}"))
    if as_json:
        print(json.dumps(out, indent=2))
    else:
        print_explanation(out)
    exit_now(0)
