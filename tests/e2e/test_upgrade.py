"""The upgrade promise (issue 18): release N takes over every workflow release N-1 started,
and both may serve the same task queue during a rolling upgrade.

The previous release (``tests/support/releases.py``: the newest release in releases.toml
older than the code under test, else commit 082a540) is exported from the repository's own
history with ``git archive``, and its controller (its own ``python worker.py``, importing its
own packages, not the ones installed here: checked before it starts; at its own line's
``REAPER_PEER_VERSION``, as CHANGELOG.md's upgrade path requires) runs against a Temporal
dev server and a Postgres database of this test's own. Simulated agents beat every second
and the scheduler's rows are inserted directly. Every worker drains, so that no worker is
placeable; the previous release alone loses a silent worker (``w-owed``: reaped, its
replacement owed) and destroys a dropped handle (``c-h-0``). Then, until work is in flight
in every step:

- a handle waiting out its ``MISSING_TTL`` (``c-h-1`` of ``w-handle``, dropped);
- a stalled worker about to be lost (``w-stall``, silent, its task running);
- a reap in progress (``w-reap`` force-reaped while another session holds its task's row:
  the reap's transaction, a local activity in the reap child's first workflow task since
  ``in-task-loss``, waits on the lock and is retried at its timeout);
- an owed replacement (``w-owed``'s);
- a worker in the middle of a retire (``w-retire``, its ``retire_worker`` attempts held by
  the same lock).

(A release whose migrations alter ``reaper.tasks`` or ``reaper.workers``, as 1.2's do, waits
for the session's locks: the session then ends its transaction, as an operator's long one
would, and the held work is free from that moment.)

Then the current release's controller (``python worker.py`` of this checkout) takes over on
the same task queue, server and database: ``sequential``: the old one stops, then the new
one starts, with ``REAPER_PEER_VERSION`` raised to its own line (as the CHANGELOG's upgrade
steps say once no older controller serves); ``overlap``: the new one starts, at the default
peer version, and both serve until the new one has taken workflow and activity tasks and
the held work is done, then the old one stops. Once the new
one serves, a new worker (``w-new``) registers and the lock is released. Expected: no failed
workflow task on any workflow; each due step done once and on time (each handle destroyed
once, at its TTL; each silent worker lost once, at its ``LOST_AFTER``, and reaped once; the
held reap and retirement once, after the lock's release; the owed replacement placed once,
within ``2 x HEARTBEAT_INTERVAL`` of ``w-new`` registering); every replacement created once
and placed once, and no service ever above its ``desired_count``; every run either
controller wrote replays on the code under test.

It prints its timeline (seconds since its start: each phase, and each ``events`` row at its
transaction's start); run it with ``-s`` to see it. It is marked ``upgrade`` and runs as its
own step (``make upgrade``). ``REAPER_UPGRADE_FROM=<commit>`` runs another commit as the
previous release; ``REAPER_UPGRADE_KEEP=<dir>`` keeps every run's history there (JSON);
``REAPER_RECORD_HISTORIES=1`` stores, in the ``sequential`` variant, runs that cover what the
previous release wrote as ``tests/workflows/histories/release-<version>-*.json`` (replayed
by tests/workflows/test_replay.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.service import RPCError, RPCStatusCode

from reaper import __version__
from reaper.core.policy.rollout import RELEASE_LINES
from reaper.infra.temporal import connect
from reaper.kit.temporal import DevServer
from tests.support.agents import Agents
from tests.support.controller import ControllerProcess
from tests.support.heartbeats import beats_handled, query_state
from tests.support.polling import eventually
from tests.support.releases import (
    Release,
    Unavailable,
    export,
    find_previous_release,
    load_releases,
    resolve,
)
from tests.support.scheduler import setup_service
from tests.support.upgrade import (
    Event,
    Observer,
    Timeline,
    failed_workflow_tasks,
    histories,
    replay_failures,
    store,
    task_takers,
)
from workflows.common import fleet_monitor_id, liveness_id, reap_id

pytestmark = [pytest.mark.e2e, pytest.mark.upgrade]

HEARTBEAT_S, STALL_S, LOST_S, TTL_S, STICKY_S = 1.0, 6.0, 20.0, 20.0, 2.0
"""Seconds. ``STALL_AFTER`` is longer than a hand-over takes here (the new controller
serving a few seconds after the old one stopped): a liveness that sees no beat for longer
judges the worker returned when the beats reach it, and the TTL of its missing handles
starts again (rule 4: silence is no evidence); the test then expects the destroy that much
later, and says so in the timeline."""
TIMINGS = {
    "REAPER_HEARTBEAT_INTERVAL": f"{HEARTBEAT_S:g}s",
    "REAPER_STALL_AFTER": f"{STALL_S:g}s",
    "REAPER_LOST_AFTER": f"{LOST_S:g}s",
    "REAPER_MISSING_TTL": f"{TTL_S:g}s",
    "REAPER_RESYNC_INTERVAL": "2s",
    "REAPER_STICKY_TIMEOUT": f"{STICKY_S:g}s",
    # Three of the five first workers end up lost: a fleet judged in full disruption at the
    # default threshold would hold the automatic reaps back (rule 6), which is not what this
    # test is about.
    "REAPER_DISRUPTION_THRESHOLD": "1",
}
LATE_S = 10.0
"""How late a timed step may be seen done after it fell due (or after the new controller
was serving, if it fell due while none was): a deadline timer's slack, a sticky queue's
timeout (``STICKY_S``) and the outage grace (``STALL_S``) if the liveness judged it late,
one or two workflow tasks and activities on a loaded two-core machine."""
RESUME_S = 30.0
"""How long after the lock's release the held reap and retirement may take: CONTRACT.md
rule 8 (work interrupted by a controller restart resumes within 30 s); their attempts back
off up to 10 s, each waiting up to 3 s for the lock (reaper/infra/db.py ``LOCK_TIMEOUT_S``)."""
POLL_S = 0.2
"""How often the test looks at Postgres and Temporal while it waits."""
RECORD = os.environ.get("REAPER_RECORD_HISTORIES") == "1"
HISTORIES = Path(__file__).parents[1] / "workflows" / "histories"

HANDLE, OWED, REAP, STALL, RETIRE, NEW = (
    "w-handle",
    "w-owed",
    "w-reap",
    "w-stall",
    "w-retire",
    "w-new",
)
FIRST = [HANDLE, OWED, REAP, STALL, RETIRE]
SERVICES = {OWED: "svc-owed", REAP: "svc-reap", STALL: "svc-stall", RETIRE: "svc-retire"}
TASKS = {w: f"t-{w.removeprefix('w-')}" for w in SERVICES}
EARLY, DROPPED, KEPT, RETIRED_C = "c-h-0", "c-h-1", "c-h-2", "c-r-1"
"""Containers: ``w-handle``'s dropped before the hand-over and destroyed by the previous
release, dropped just before it (in flight), kept; ``w-retire``'s."""


@dataclass
class Dues:
    """When the timed steps fell due and when the hand-over happened (timeline seconds)."""

    destroy: float
    """``c-h-1`` due for destruction (its TTL after it was marked, or after a return)."""
    lost: float
    """``w-stall`` due to be lost."""
    early_destroy: float
    """``c-h-0`` due for destruction (under the previous release)."""
    early_lost: float
    """``w-owed`` due to be lost (under the previous release)."""
    ready: float
    """The current controller serving."""
    stopped: float
    """The previous controller stopped."""
    released: float
    """The lock released (the held reap and retirement free to finish)."""


@dataclass
class OldRelease:
    release: Release
    root: Path


@pytest.fixture
def old_release(tmp_path) -> OldRelease:
    """The previous release exported from git, its version made visible to its own
    ``reaper.__version__`` (a ``dist-info`` beside its packages, as an installed release
    has one); skipped with one line if git or the commit is not available."""
    wanted = os.environ.get("REAPER_UPGRADE_FROM")
    try:
        if wanted:
            full = resolve(wanted)
            listed = [r for r in load_releases() if full.startswith(r.commit)]
            release = listed[0] if listed else Release(version=None, commit=full, date="")
            release = Release(release.version, full, release.date)
        else:
            release = find_previous_release()
        root = export(release.commit, tmp_path / "previous")
    except Unavailable as exc:
        pytest.skip(f"upgrade test needs the repository's history: {exc}")
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    meta = root / f"reaper-{project['version']}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: reaper\nVersion: {project['version']}\n"
    )
    return OldRelease(release, root)


@pytest_asyncio.fixture
async def own_temporal(tmp_path) -> AsyncIterator[tuple[DevServer, Client]]:
    """A dev server of this test's own (continue-as-new suggested every ~30 events, so
    runs the old release started are continued by the new one), and a client of it."""
    server = DevServer(tmp_path / "temporal.log", continue_as_new_after=30)
    await server.up()
    try:
        yield server, await connect(server.address, "default", deadline_s=60)
    finally:
        server.stop()


def imports_of(proc: ControllerProcess) -> dict[str, str]:
    """Where ``proc``'s interpreter, started as ``proc`` is, finds reaper's packages."""
    probe = (
        "import json, sys, worker, workflows, activities, reaper;"
        "print(json.dumps({m: sys.modules[m].__file__ for m in"
        " ('worker', 'workflows', 'activities', 'reaper')}))"
    )
    env = {k: v for k, v in proc.env.items() if not k.startswith("REAPER_")}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=proc.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"{proc.root}: cannot import the controller:\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


async def serving(proc: ControllerProcess, timeout: float = 90) -> str:
    """Wait for ``proc``'s start-up line (``controller ... serving task queue ...``)."""

    async def line() -> str | None:
        if not proc.alive():
            raise AssertionError(f"controller exited ({proc.proc.returncode}):\n{proc.tail()}")
        text = proc.log.read_text(errors="replace") if proc.log.exists() else ""
        return next((ln for ln in text.splitlines() if "serving task queue" in ln), None)

    found = await eventually(line, bool, timeout=timeout, poll=0.1, what="the controller serving")
    assert found is not None
    return found


async def serving_past_the_lock(
    proc: ControllerProcess, lock: asyncpg.Connection, tl: Timeline
) -> tuple[str, float | None]:
    """:func:`serving`, except that when the controller's migrations wait for a table lock
    this test's session holds (a migration that alters ``reaper.tasks`` or
    ``reaper.workers`` needs every lock on it released: 1.2's do), the session's
    transaction ends, as an operator's long transaction would, and the wait goes on.

    Returns:
        The start-up line, and when the session's locks were released (``None``: still held).
    """
    released: float | None = None

    async def line() -> str | None:
        nonlocal released
        if not proc.alive():
            raise AssertionError(f"controller exited ({proc.proc.returncode}):\n{proc.tail()}")
        text = proc.log.read_text(errors="replace") if proc.log.exists() else ""
        if released is None and "waits for a table lock" in text:
            await lock.execute("ROLLBACK")
            released = tl.phase("the current release's migration waits for the held lock: released")
        return next((ln for ln in text.splitlines() if "serving task queue" in ln), None)

    found = await eventually(line, bool, timeout=90, poll=0.1, what="the controller serving")
    assert found is not None
    return found, released


async def pending_attempt(client: Client, workflow_id: str, activity: str) -> tuple[int, str]:
    """``(attempt, last failure)`` of the workflow's pending ``activity``; ``(0, "")`` if
    none is pending (or the workflow has not started yet)."""
    try:
        desc = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:  # not started yet
            return 0, ""
        raise
    for p in desc.raw_description.pending_activities:
        if p.activity_type.name == activity:
            return p.attempt, p.last_failure.message
    return 0, ""


async def reap_blocked(client: Client, pool: asyncpg.Pool, workflow_id: str) -> bool:
    """Whether the reap ``workflow_id`` has started and a transaction of this database waits
    on a row lock (the reap's, on the task row the test's session holds)."""
    try:
        await client.get_workflow_handle(workflow_id).describe()
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            return False
        raise
    waiting = await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND query LIKE '%reaper.tasks%'"
    )
    return bool(waiting)


def until(fn, check, *, timeout: float, what: str, poll: float = POLL_S):  # type: ignore[no-untyped-def]
    """:func:`eventually`, looking every ``POLL_S`` unless told."""
    return eventually(fn, check, timeout=timeout, what=what, poll=poll)


def message(line: str) -> str:
    """The message of a controller's log line (JSON, or text)."""
    try:
        return str(json.loads(line)["msg"])
    except (ValueError, KeyError):
        return line


async def column(pool: asyncpg.Pool, sql: str, *args: object) -> object:
    return await pool.fetchval(sql, *args)


@pytest.mark.parametrize("variant", ["sequential", "overlap"])
async def test_the_current_release_takes_over_the_previous_releases_work(
    variant, old_release, own_temporal, db_url, tmp_path
):
    server, client = own_temporal
    tl = Timeline()
    began = time.monotonic()
    release = old_release.release
    # The previous release runs at its own line, as the CHANGELOG's upgrade path requires of
    # a fleet before this release takes it over (every run it started records that line).
    own_line = ".".join(release.version.split(".")[:2]) if release.version else None
    old_env = TIMINGS | ({"REAPER_PEER_VERSION": own_line} if own_line else {})
    old = ControllerProcess(
        server.address, db_url, tmp_path / "old.log", old_env, root=old_release.root
    )
    # Once the previous release no longer serves, the operator raises the peer version
    # (CHANGELOG.md's Upgrade): the sequential hand-over runs the current line's commands
    # for every run that starts after it; the overlap keeps the default (the previous line).
    peer = {"REAPER_PEER_VERSION": RELEASE_LINES[-1]} if variant == "sequential" else {}
    new = ControllerProcess(
        server.address, db_url, tmp_path / "new.log", TIMINGS | peer, old.task_queue
    )

    # The old controller runs the exported release's code, not the checkout installed here.
    found = imports_of(old)
    for module in ("worker", "workflows", "activities", "reaper"):
        assert Path(found[module]).is_relative_to(old_release.root), (module, found)
    assert Path(imports_of(new)["workflows"]).is_relative_to(new.root)
    old.start()
    line = await serving(old)
    if release.version is not None:
        assert f"(reaper {release.version})" in line, line
    tl.phase(f"previous controller serving: {message(line)}")

    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=4)
    lock = await asyncpg.connect(db_url)  # the session that holds two task rows
    observer = Observer(pool, tl)
    try:
        async with observer.running():
            dues = await run_scenario(variant, client, pool, lock, old, new, tl, release)
        tl.phase("observations over")
        await verify(client, pool, old, new, observer, dues, variant)
    except BaseException:
        with contextlib.suppress(Exception):  # the likeliest cause, if it is one
            if failed := failed_workflow_tasks(await histories(client, old.task_queue)):
                print(f"failed workflow tasks: {failed}")
        raise
    finally:
        print(f"\ntimeline ({variant}; previous {release.name}; current {__version__}):")
        print(tl.render())
        print(f"run time {time.monotonic() - began:.1f} s", flush=True)
        await lock.close()
        await pool.close()
        old.stop()
        new.stop()
        shutil.rmtree(old_release.root, ignore_errors=True)


async def run_scenario(
    variant: str,
    client: Client,
    pool: asyncpg.Pool,
    lock: asyncpg.Connection,
    old: ControllerProcess,
    new: ControllerProcess,
    tl: Timeline,
    release: Release,
) -> Dues:
    """Drive the previous release until work is in flight in every step, hand over to the
    current one, and wait until every step is done."""
    tq = old.task_queue
    await pool.executemany(
        "INSERT INTO reaper.containers (handle, worker) VALUES ($1, $2)",
        [(EARLY, HANDLE), (DROPPED, HANDLE), (KEPT, HANDLE), (RETIRED_C, RETIRE)],
    )
    for worker, service in SERVICES.items():
        await setup_service(pool, service, {worker: [TASKS[worker]]})
    with Agents(client, tq, interval=HEARTBEAT_S) as agents:
        agents.reports = {HANDLE: {"containers": [EARLY, DROPPED, KEPT]}}
        agents.reports |= {w: {"tasks": [TASKS[w]]} for w in SERVICES}
        agents.reports[RETIRE]["containers"] = [RETIRED_C]
        await until(
            lambda: column(
                pool,
                "SELECT count(*) FROM reaper.workers w JOIN reaper.tasks t ON t.worker = w.name"
                " WHERE w.state = 'running' AND t.state = 'running'",
            ),
            lambda n: n == len(TASKS),
            timeout=60,
            what=f"the first workers and their tasks running\n{old.tail()}",
        )
        for w in FIRST:
            await client.get_workflow_handle(liveness_id(w)).signal("drain", {"reason": "upgrade"})
        await until(
            lambda: column(pool, "SELECT count(*) FROM reaper.workers WHERE draining"),
            lambda n: n == len(FIRST),
            timeout=30,
            what="every worker draining",
        )
        tl.phase(f"{len(FIRST)} workers running, their tasks running, all draining")

        # Done by the previous release alone: w-owed's host dies (lost, reaped while no
        # worker is placeable: its replacement is owed); c-h-0 is dropped (destroyed).
        del agents.reports[OWED]
        agents.reports[HANDLE] = {"containers": [DROPPED, KEPT]}
        early_marked = await until(
            lambda: column(
                pool, "SELECT missing_since FROM reaper.containers WHERE handle = $1", EARLY
            ),
            lambda v: v is not None,
            timeout=30,
            what=f"{EARLY} marked missing",
        )
        tl.phase(f"{OWED} silent; {EARLY} missing")

        # A reap and a retirement in progress: their transactions wait for the task rows
        # this session holds, fail at the lock timeout, and are retried.
        await lock.execute("BEGIN")
        await lock.execute(
            "SELECT id FROM reaper.tasks WHERE id = ANY($1::text[]) FOR UPDATE",
            [TASKS[REAP], TASKS[RETIRE]],
        )
        tl.phase(f"lock held on {TASKS[REAP]} and {TASKS[RETIRE]}")
        del agents.reports[REAP], agents.reports[RETIRE]
        await client.get_workflow_handle(liveness_id(REAP)).signal(
            "force_reap", {"reason": "host gone"}
        )
        await client.get_workflow_handle(liveness_id(RETIRE)).signal(
            "retire", {"reason": "scale-in"}
        )
        # The reap's transaction runs as a local activity in the reap child's first workflow
        # task (in-task-loss): no pending activity to describe; it waits on the held row.
        await until(
            lambda: reap_blocked(client, pool, reap_id(REAP, 1)),
            bool,
            timeout=60,
            what="the reap waiting on the held row",
        )
        tl.phase(f"reap of {REAP} in its child's first task, waiting on {TASKS[REAP]}'s lock")
        retire = await until(
            lambda: pending_attempt(client, liveness_id(RETIRE), "retire_worker"),
            lambda a: a[0] >= 2,
            timeout=60,
            what="the retirement retried",
        )
        tl.phase(f"retirement of {RETIRE} at attempt {retire[0]} ({retire[1]})")
        await until(
            lambda: column(
                pool,
                "SELECT count(*) FROM reaper.tasks WHERE service = $1 AND state = 'pending'"
                " AND worker IS NULL",
                SERVICES[OWED],
            ),
            lambda n: n == 1,
            timeout=LOST_S + 30,
            what="w-owed lost and its replacement owed",
        )
        await until(
            lambda: column(pool, "SELECT count(*) FROM reaper.containers WHERE handle = $1", EARLY),
            lambda n: n == 0,
            timeout=TTL_S + 30,
            what=f"{EARLY} destroyed",
        )
        owed_beat = (await query_state(client, OWED)).last_heartbeat_at
        assert owed_beat is not None
        tl.phase(f"{OWED} lost and reaped, its replacement owed; {EARLY} destroyed")

        # A handle waiting out its TTL.
        agents.reports[HANDLE] = {"containers": [KEPT]}
        marked = await until(
            lambda: column(
                pool, "SELECT missing_since FROM reaper.containers WHERE handle = $1", DROPPED
            ),
            lambda v: v is not None,
            timeout=30,
            what=f"{DROPPED} marked missing",
        )
        destroy_due = marked + timedelta(seconds=TTL_S)  # type: ignore[operator]

        # A stalled worker about to be lost.
        del agents.reports[STALL]
        await until(
            lambda: column(pool, "SELECT state FROM reaper.workers WHERE name = $1", STALL),
            lambda s: s == "stalled",
            timeout=30,
            what=f"{STALL} stalled",
        )
        last_beat = (await query_state(client, STALL)).last_heartbeat_at
        assert last_beat is not None
        lost_due = last_beat + timedelta(seconds=LOST_S)
        await in_flight(client, pool, tl, destroy_due, lost_due)

        # The hand-over.
        if variant == "sequential":
            stopping = time.monotonic()
            old.stop()
            stopped = tl.phase(f"previous controller stopped ({time.monotonic() - stopping:.1f} s)")
            if RECORD and release.version is not None:
                written = store(await histories(client, tq), release.version, HISTORIES)
                tl.phase(f"recorded {len(written)} histories of {release.name}")
            new.start()
            line, early = await serving_past_the_lock(new, lock, tl)
            tl.phase(f"current controller serving: {message(line)}")
        else:
            new.start()
            line, early = await serving_past_the_lock(new, lock, tl)
            tl.phase(f"current controller serving beside the previous: {message(line)}")
        assert f"(reaper {__version__})" in line, line
        ready = tl.at()
        both_since = datetime.now(UTC)
        agents.reports[NEW] = {}
        if early is None:
            await lock.execute("ROLLBACK")
            released = tl.phase(f"{NEW} beating; lock released")
        else:
            released = early
            tl.phase(f"{NEW} beating")
        if variant == "overlap":
            # Both releases take both kinds of task while both serve. Waiting for the new one
            # alone once left the old with no activity task in a 2.2 s overlap (a fresh
            # clone's CI run, 2026-12-06).
            for ctl, which in ((new, "current"), (old, "previous")):
                await until(
                    lambda ctl=ctl: took_tasks(client, tq, ctl.identity, both_since),
                    lambda kinds: {"workflow", "activity"} <= kinds,
                    timeout=60,
                    poll=1.0,
                    what=f"the {which} controller taking workflow and activity tasks",
                )
            await until(
                lambda: column(pool, "SELECT count(*) FROM reaper.tasks WHERE worker = $1", NEW),
                lambda n: n >= 3,  # the owed one, the held reap's and retirement's
                timeout=RESUME_S + 30,
                what="the held work done while both serve",
            )
            stopping = time.monotonic()
            old.stop()
            stopped = tl.phase(f"previous controller stopped ({time.monotonic() - stopping:.1f} s)")

        await until(
            lambda: column(pool, "SELECT count(*) FROM reaper.tasks WHERE worker = $1", NEW),
            lambda n: n == len(SERVICES),
            timeout=LOST_S + RESUME_S + 30,
            what=f"every replacement on {NEW}\n{new.tail()}",
        )
        await until(
            lambda: column(
                pool, "SELECT count(*) FROM reaper.containers WHERE handle = $1", DROPPED
            ),
            lambda n: n == 0,
            timeout=TTL_S + 30,
            what=f"{DROPPED} destroyed",
        )
        await until(
            lambda: column(pool, "SELECT state FROM reaper.workers WHERE name = $1", RETIRE),
            lambda s: s == "retired",
            timeout=30,
            what=f"{RETIRE} retired",
        )
        tl.phase("every step done")
        await beats_handled(client, HANDLE, 3, timeout=60)  # time for a double to show

    # A hand-over longer than STALL_AFTER: the liveness judged the worker returned (its
    # state_since moved) and the TTL started again then (rule 4).
    since = (await query_state(client, HANDLE)).state_since
    done = await column(
        pool,
        "SELECT min(at) FROM reaper.events WHERE action = 'destroyed' AND handle = $1",
        DROPPED,
    )
    if since is not None and marked < since < done:  # type: ignore[operator]
        destroy_due = since + timedelta(seconds=TTL_S)
        tl.phase(
            f"{HANDLE} was judged returned at {tl.at(since):.1f} s (no beat for STALL_AFTER):"
            f" destroy due at {tl.at(destroy_due):.1f} s"
        )
    return Dues(
        destroy=tl.at(destroy_due),
        lost=tl.at(lost_due),
        early_destroy=tl.at(early_marked + timedelta(seconds=TTL_S)),  # type: ignore[operator]
        early_lost=tl.at(owed_beat + timedelta(seconds=LOST_S)),
        ready=ready,
        stopped=stopped,
        released=released,
    )


async def in_flight(
    client: Client, pool: asyncpg.Pool, tl: Timeline, destroy_due: datetime, lost_due: datetime
) -> None:
    """Check that work is in flight in every step, as the hand-over begins."""
    row = await pool.fetchrow(
        "SELECT"
        " (SELECT missing_since FROM reaper.containers WHERE handle = $1) AS marked,"
        " (SELECT state FROM reaper.workers WHERE name = $2) AS stall,"
        " (SELECT state FROM reaper.tasks WHERE id = $3) AS reap_task,"
        " (SELECT state FROM reaper.workers WHERE name = $4) AS retire,"
        " (SELECT state FROM reaper.tasks WHERE id = $5) AS retire_task,"
        " (SELECT count(*) FROM reaper.tasks WHERE worker IS NULL AND state = 'pending')"
        "  AS owed",
        DROPPED,
        STALL,
        TASKS[REAP],
        RETIRE,
        TASKS[RETIRE],
    )
    # The reap child still running (its transaction waits on the lock, or backs off
    # between attempts), its task untouched.
    reap = (await client.get_workflow_handle(reap_id(REAP, 1)).describe()).close_time is None
    retire = await pending_attempt(client, liveness_id(RETIRE), "retire_worker")
    now = tl.at()
    assert now < tl.at(destroy_due) and now < tl.at(lost_due), (
        "the set-up took longer than MISSING_TTL or LOST_AFTER: nothing timed is in flight"
    )
    assert row["marked"] is not None and row["stall"] == "stalled", dict(row)
    assert row["reap_task"] == "running" and reap, dict(row)
    assert row["retire"] != "retired" and row["retire_task"] == "running", dict(row)
    assert retire[0] >= 2 and row["owed"] == 1, (dict(row), retire)
    tl.phase(
        f"in flight: {DROPPED} missing, destroy due at {tl.at(destroy_due):.1f} s;"
        f" {STALL} stalled, lost due at {tl.at(lost_due):.1f} s; reap of {REAP} waiting on"
        f" its lock; retirement of {RETIRE} at attempt {retire[0]}; 1 replacement owed"
    )


async def took_tasks(
    client: Client, task_queue: str, identity: str, since: datetime | None = None
) -> set[str]:
    """The kinds of task (``workflow``, ``activity``) ``identity`` took on ``task_queue``
    (since ``since``, UTC, if given)."""
    return {
        kind
        for h in await histories(client, task_queue)
        for at, who, kind in task_takers(h)
        if who == identity and (since is None or at >= since)
    }


async def verify(
    client: Client,
    pool: asyncpg.Pool,
    old: ControllerProcess,
    new: ControllerProcess,
    observer: Observer,
    dues: Dues,
    variant: str,
) -> None:
    """What the hand-over must have kept: every step done once and on time, nothing
    doubled, no failed workflow task, every run replayable on the code under test."""
    tl = observer.timeline
    runs = await histories(client, old.task_queue)
    if keep := os.environ.get("REAPER_UPGRADE_KEEP"):
        where = Path(keep) / variant
        where.mkdir(parents=True, exist_ok=True)
        for h in runs:
            (where / f"{h.workflow_id}-{h.run_id}.json").write_text(h.to_json())

    # First what says most when it fails: no failed workflow task on any workflow (a
    # nondeterminism shows here), and everything both controllers wrote replays here.
    assert not (failed := failed_workflow_tasks(runs)), failed
    assert not (unreplayable := await replay_failures(runs)), unreplayable

    def on_time(e: Event, due: float, served_again: float = 0.0) -> None:
        """Not before ``due`` (its transaction started after it), seen by ``due`` plus
        LATE_S, or, if it fell due while no controller served, ``served_again`` plus
        LATE_S."""
        assert due <= tl.at(e.at) and e.seen <= max(due, served_again) + LATE_S, (e, due, dues)

    # The handles: c-h-0 destroyed once by the previous release, c-h-1 once at its TTL
    # across the hand-over, c-h-2 kept.
    for handle, due, served in (
        (EARLY, dues.early_destroy, 0.0),
        (DROPPED, dues.destroy, dues.ready),
    ):
        destroyed = observer.of("destroyed", handle)
        assert len(destroyed) == 1, destroyed
        on_time(destroyed[0], due, served)
    assert not observer.of("destroyed", KEPT)

    # The silent workers: each lost once, at LOST_AFTER, never back, and reaped then.
    for worker, due, served in ((OWED, dues.early_lost, 0.0), (STALL, dues.lost, dues.ready)):
        states = [e for e in observer.of("state") if e.worker == worker]
        moves = [(e.reason or "").split(":")[0] for e in states]
        assert moves[-2:] == ["running -> stalled", "stalled -> lost"], moves
        assert sum("-> lost" in m for m in moves) == 1, moves
        on_time(states[-1], due, served)
        reaped = observer.of("lost", TASKS[worker], kind="task")
        assert reaped and reaped[0].seen <= tl.at(states[-1].at) + LATE_S, (reaped, states)

    # Each first task taken down once, by its own step; the held reap and retirement
    # once the lock was released.
    for w, task in TASKS.items():
        down = observer.of("lost", task, kind="task")
        assert len(down) == 1, (task, down)
        why = {RETIRE: "retired: scale-in", REAP: "host gone"}
        assert (down[0].reason or "").startswith(why.get(w, f"no heartbeat for {LOST_S:g}s")), down
    for w in (REAP, RETIRE):
        seen = observer.of("lost", TASKS[w], kind="task")[0].seen
        assert dues.released <= seen <= dues.released + RESUME_S + 1, (w, seen, dues)
    retired = [e for e in observer.of("state") if e.worker == RETIRE and "retired" in e.reason]
    assert len(retired) == 1, retired
    assert len(observer.of("destroyed", RETIRED_C)) == 1

    # Every replacement created once and placed once (when created, or once when a worker
    # became available: owed), all on w-new; the owed one within 2 x HEARTBEAT_INTERVAL of
    # w-new registering; no service ever above its desired_count.
    replaced = observer.of("replaced", kind="task")
    services = [(e.handle or "").rsplit("-", 1)[0] for e in replaced]
    assert Counter(services) == Counter(SERVICES.values()), replaced
    rows = {r["id"]: r for r in await pool.fetch("SELECT * FROM reaper.tasks")}
    for e, service in zip(replaced, services, strict=True):
        row = rows[e.handle]
        owed = "owed:" in (e.reason or "")
        assert len(observer.of("placed", e.handle)) == (1 if owed else 0), e
        worker = next(w for w, s in SERVICES.items() if s == service)
        assert (row["worker"], row["state"], row["replaces"]) == (NEW, "pending", TASKS[worker])
    registered = next(e for e in observer.of("state") if e.worker == NEW)
    placed = observer.of("placed", replaced[services.index(SERVICES[OWED])].handle)[0]
    assert placed.seen <= tl.at(registered.at) + 2 * HEARTBEAT_S + LATE_S, (placed, registered)
    over = {s: n for s, n in observer.max_active.items() if n > observer.desired[s]}
    assert not over, f"services above desired_count: {over}"

    # The old controller did the work before the hand-over, the new one took over its
    # workflows (the fleet monitor and a liveness it had started); in the overlap both
    # took tasks while both served.
    took: dict[str, set[str]] = {}
    during: Counter[tuple[str, str]] = Counter()
    for h in runs:
        for at, who, kind in task_takers(h):
            took.setdefault(h.workflow_id, set()).add(who)
            if dues.ready <= tl.at(at) <= dues.stopped:
                during[who, kind] += 1
    for wid in (fleet_monitor_id(old.task_queue), liveness_id(HANDLE)):
        assert {old.identity, new.identity} <= took.get(wid, set()), (wid, took.get(wid))
    if variant == "overlap":
        for who in (old.identity, new.identity):
            assert during[who, "workflow"] and during[who, "activity"], (who, during)
    # The raised peer version took effect (sequential): runs the current controller started
    # recorded the current line in their start-up read, so they use its command changes
    # (which the replays above covered); at the default (overlap) none did, so the previous
    # release could replay every run it was handed.
    peers = Counter(v for h in runs for v in recorded_peer_versions(h))
    raised = peers[RELEASE_LINES[-1]] > 0
    assert raised is (variant == "sequential"), (variant, peers)
    both = sum(1 for who in took.values() if {old.identity, new.identity} <= who)
    shared = ", ".join(f"{n} {kind} tasks by {who}" for (who, kind), n in sorted(during.items()))
    tl.phase(
        f"checked {len(runs)} runs of {len(took)} workflows ({both} served by both): no failed"
        " workflow task, every run replays on the current code"
        + (f"; while both served: {shared}" if variant == "overlap" else "")
    )


def recorded_peer_versions(history: WorkflowHistory) -> list[str]:
    """The peer versions (``REAPER_PEER_VERSION``) a liveness run's start-up reads recorded
    (``begin_liveness`` results, an activity's or, with ``one-task-start``, a local
    activity's marker; a release before 1.1 records none)."""
    found = []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            payloads = list(e.activity_task_completed_event_attributes.result.payloads)
        elif e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            result = e.marker_recorded_event_attributes.details.get("result")
            payloads = list(result.payloads) if result is not None else []
        else:
            continue
        for payload in payloads:
            try:
                data = json.loads(payload.data) if payload.data else None
            except ValueError:
                continue
            timings = data.get("timings") if isinstance(data, dict) else None
            if isinstance(timings, dict) and "peer_version" in timings:
                found.append(timings["peer_version"])
    return found
