"""What a new user hit with the command line (issue 21, item 7), each as the user met it:
real ``reaper`` processes against a real Postgres and dev server."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import asyncpg
import pytest
from temporalio.testing import WorkflowEnvironment

from tests.support import cli

OPERATOR_COMMANDS = ("drain", "undrain", "retire", "force-reap")


def reaper(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``reaper ARGS`` in a fresh process; no ``REAPER_*`` of the caller, no ``.env``."""
    return cli.reaper(*args, env={**(env or {}), "COLUMNS": "100"}, cwd=Path(__file__).parent)


def address(env: WorkflowEnvironment) -> str:
    return env.client.service_client.config.target_host


@pytest.mark.parametrize("command", OPERATOR_COMMANDS)
def test_an_argument_renders_as_its_name(command: str) -> None:
    out = reaper(command, "--help")
    assert out.returncode == 0, out
    usage = out.stdout.splitlines()[0]
    assert usage.endswith(f" {command} [OPTIONS] WORKER"), usage
    assert "{WORKER}" not in out.stdout and "<str>" not in out.stdout, out.stdout
    assert "\n  WORKER  The worker's name." in out.stdout, out.stdout


def test_a_bad_flag_value_is_reported_under_the_flag() -> None:
    out = reaper("run", "--lost-after", "5x")
    assert out.returncode == 2, out
    assert "--lost-after: '5x' is not a duration" in out.stderr, out.stderr
    assert "REAPER_LOST_AFTER" not in out.stderr
    # From the environment, the variable is the name the user knows.
    out = reaper("run", env={"REAPER_LOST_AFTER": "5x"})
    assert out.returncode == 2 and "REAPER_LOST_AFTER: '5x'" in out.stderr, out
    # A rule between two values names each as it was given.
    out = reaper("run", "--stall-after", "15s", env={"REAPER_HEARTBEAT_INTERVAL": "10s"})
    assert out.returncode == 2, out
    assert "--stall-after must be at least 2 * REAPER_HEARTBEAT_INTERVAL" in out.stderr, out
    out = reaper("agent", "--worker", "w1", "--state-dir", "/tmp/x", "--heartbeat-interval", "x")
    assert out.returncode == 2 and "--heartbeat-interval: 'x'" in out.stderr, out


async def test_read_only_commands_ignore_controller_timings(
    dev_env: WorkflowEnvironment, db_url: str, pool: asyncpg.Pool
) -> None:
    # Out of range for a controller (STALL_AFTER < 2 x HEARTBEAT_INTERVAL): `reaper run`
    # refuses it, the commands that only read or signal do not read it at all.
    bad = {"REAPER_STALL_AFTER": "1s", "REAPER_LOST_AFTER": "soon", "REAPER_DATABASE_URL": db_url}
    assert reaper("run", env=bad).returncode == 2
    out = reaper("workers", "--json", "--address", address(dev_env), env=bad)
    assert out.returncode == 0, out
    assert "workers" in json.loads(out.stdout)
    out = reaper("events", env=bad)
    assert out.returncode == 0, out
    name = f"nobody-{uuid.uuid4().hex[:6]}"
    out = reaper("drain", name, "--reason", "t", "--address", address(dev_env), env=bad)
    assert out.returncode == 1 and f"unknown worker '{name}'" in out.stderr, out


async def test_events_with_no_rows_says_so(db_url: str, pool: asyncpg.Pool) -> None:
    env = {"REAPER_DATABASE_URL": db_url}
    out = reaper("events", env=env)
    assert out.returncode == 0 and out.stdout.strip() == "no events", out
    out = reaper("events", "--worker", "w9", "--kind", "task", env=env)
    assert out.stdout.strip() == "no events (worker w9, kind task)", out
    out = reaper("events", "--json", env=env)
    assert out.returncode == 0 and out.stdout == "", out  # JSON lines only on stdout
    assert out.stderr.strip() == "no events", out


async def test_workers_tasks_shows_which_task_runs_where(
    dev_env: WorkflowEnvironment, db_url: str, pool: asyncpg.Pool
) -> None:
    a, b = f"wa-{uuid.uuid4().hex[:6]}", f"wb-{uuid.uuid4().hex[:6]}"
    await pool.execute("INSERT INTO reaper.services (name, desired_count) VALUES ('web', 4)")
    await pool.executemany(
        "INSERT INTO reaper.tasks (id, service, worker, state) VALUES ($1, 'web', $2, $3)",
        [
            ("web-1", a, "running"),
            ("web-2", a, "pending"),
            ("web-3", b, "running"),
            ("web-4", None, "pending"),
            ("web-0", b, "lost"),
        ],
    )
    env = {"REAPER_DATABASE_URL": db_url}
    out = reaper("workers", "--tasks", "--json", "--address", address(dev_env), env=env)
    assert out.returncode == 0, out
    tasks = json.loads(out.stdout)["tasks"]
    assert {w: [(t["id"], t["state"]) for t in ts] for w, ts in tasks.items()} == {
        a: [("web-1", "running"), ("web-2", "pending")],
        b: [("web-3", "running")],
        "(owed)": [("web-4", "pending")],
    }
    out = reaper("workers", "--tasks", "--address", address(dev_env), env=env)
    assert out.returncode == 0, out
    assert "5 tasks" not in out.stdout and "4 tasks by worker" in out.stdout, out.stdout
    rows = [ln.split() for ln in out.stdout.splitlines() if "web-" in ln]
    assert [r for r in rows if a in r] and any("web-4" in r and "(owed)" in r for r in rows)
    # Without the flag, counts only (as before).
    out = reaper("workers", "--json", "--address", address(dev_env), env=env)
    assert "tasks" not in json.loads(out.stdout)
