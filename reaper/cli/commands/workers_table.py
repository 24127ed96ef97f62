"""``reaper workers``' table: the fleet line and one row per worker, as people read them
(:func:`reaper.cli.commands.workers.fleet_overview` builds the data), and a worker's report
fields as both the table and ``--json`` show them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.table import Table

from reaper.cli import read
from reaper.cli.app import console, err

_STATE_STYLE = {"running": "green", "stalled": "yellow", "lost": "red", "retired": "dim"}
_FLEET_STYLE = {"normal": "green", "partial": "yellow", "full": "red"}


def age(seconds: float | None) -> str:
    """A heartbeat's age for people: ``42s ago``, ``5m ago``, ``2.5h ago`` or ``never``."""
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def complete_report(w: dict[str, Any], now: datetime) -> str:
    """The *complete report* cell: how long ago the worker's oldest kind last came complete
    as its row holds it (``2s ago``; ``never`` if one never came; ``?`` if its row is
    unknown), in yellow when ``policy.reports`` says it beats liveness only (its state cell
    then says so too)."""
    times = w.get("complete_reports")
    if not times:
        return "?"
    known = [datetime.fromisoformat(t) for t in times.values() if t]
    ago = age((now - min(known)).total_seconds()) if len(known) == len(times) else "never"
    return ago if w.get("liveness_only") is None else f"[yellow]{ago}[/]"


def print_overview(overview: dict[str, Any]) -> None:
    """The fleet line and the workers table of :func:`fleet_overview`'s result."""
    from reaper.core.policy.explain import clock

    fleet = overview["fleet"]
    if fleet is not None:
        style = _FLEET_STYLE.get(fleet["state"], "")
        since = clock(datetime.fromisoformat(fleet["since"]))
        console.print(f"fleet: [{style}]{fleet['state']}[/] since {since}", highlight=False)
    # Seven columns in 80: a rule under the header and none between the columns, one word
    # per header, a worker's name never cut (the state wraps first; issue 35).
    table = Table(
        title=f"{len(overview['workers'])} workers",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    numbers = ("missing", "orphans", "tasks")
    table.add_column("worker", no_wrap=True)
    table.add_column("state", min_width=10)
    for col in ("heartbeat", "report", *numbers):
        table.add_column(col, justify="right" if col in numbers else "left")
    now = datetime.now(UTC)
    for w in overview["workers"]:
        if "error" in w:
            table.add_row(w["worker"], f"[red]{w['error']}[/]", "", "", "", "", "")
            continue
        shown = _STATE_STYLE.get(w["state"])
        state = f"[{shown}]{w['state']}[/]" if shown else w["state"]
        if w.get("drained"):
            state += " [magenta](drained)[/]"
        elif w["draining"]:
            state += " [magenta](draining)[/]"
        if w.get("liveness_only") is not None:
            state += " [yellow](liveness only)[/]"
        tasks = "?" if w["running_tasks"] is None else str(w["running_tasks"])
        table.add_row(
            w["worker"],
            state,
            age(w["age_s"]),
            complete_report(w, now),
            str(w["missing"]),
            str(w["orphans"]),
            tasks,
        )
    console.print(table, soft_wrap=False)
    if overview.get("tasks") is not None:
        from reaper.cli.commands.worker_tasks import print_tasks

        print_tasks(overview["tasks"])
    for note in overview["notes"]:
        err.print(f"[yellow]note:[/] {note}", highlight=False)


def report_fields(times: read.ReportTimes | None, resync_interval: float) -> dict[str, Any]:
    """A worker's ``complete_reports`` (kind -> ISO time or ``None``) and ``liveness_only``
    (``{"since", "kinds"}`` as ``policy.reports.liveness_only`` judges the row, or ``None``),
    both ``None`` when its row is not known."""
    from reaper.core.policy.reports import liveness_only

    if times is None:
        return {"complete_reports": None, "liveness_only": None}
    verdict = liveness_only(
        times.state, times.last_heartbeat_at, times.complete_at, resync_interval
    )
    return {
        "complete_reports": {
            kind: at.isoformat() if at else None for kind, at in times.complete_at.items()
        },
        "liveness_only": None
        if verdict is None
        else {
            "since": verdict.since.isoformat() if verdict.since else None,
            "kinds": list(verdict.kinds),
        },
    }
