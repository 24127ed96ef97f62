"""The ``reaper`` command line signs (CONTRACT.md §5.2): ``reaper keygen``, the operator
commands' and the agent's ``--key-file``, as real processes against a real dev server,
Postgres and an in-process controller in ``REAPER_AGENT_AUTH=required`` mode."""

from __future__ import annotations

import asyncio
import signal
import stat
import uuid
from pathlib import Path

import asyncpg
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from reaper.cli.agent_retire import RETIRE_ON_STOP_REASON
from reaper.core.contract import StateView
from reaper.core.signing import (
    is_public_key,
    load_private_key,
    new_private_key,
    public_key_text,
    sign_heartbeat,
)
from tests.support.agents import AgentProcess
from tests.support.cli import reaper, run_cli
from tests.support.controller import controller, make_settings
from tests.support.heartbeats import beat, query_state, send
from tests.support.polling import eventually

FAST = dict(
    heartbeat_interval=0.2, stall_after=5, lost_after=30, missing_ttl=5, resync_interval=0.4
)
SLOW = dict(heartbeat_interval=1, stall_after=60, lost_after=120, missing_ttl=60, resync_interval=1)
"""For a worker that beats once: it stays ``running`` while the operator commands run."""


def address(env: WorkflowEnvironment) -> str:
    return env.client.service_client.config.target_host


def keygen(path: Path) -> str:
    """``reaper keygen --out PATH``; the public key it printed."""
    out = reaper("keygen", "--out", str(path))
    assert out.returncode == 0, out
    return out.stdout.strip()


async def _state_or_none(client: Client, worker: str) -> StateView | None:
    """The ``state`` query, or ``None`` before the agent's first beat started the liveness."""
    try:
        return await query_state(client, worker)
    except RPCError:
        return None


def test_keygen_writes_a_private_key_0600_and_prints_its_public_key(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "operator.pem"
    out = reaper("keygen", "--out", str(path))
    assert out.returncode == 0, out
    [line] = out.stdout.splitlines()  # the public key alone, for `>> operator_keys`
    assert is_public_key(line), line
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert public_key_text(load_private_key(path)) == line
    assert "PRIVATE" not in out.stdout + out.stderr

    # An existing key is an identity: never overwritten without --force.
    again = reaper("keygen", "--out", str(path))
    assert again.returncode == 1 and "exists" in again.stderr and "--force" in again.stderr
    assert again.stdout == "" and public_key_text(load_private_key(path)) == line
    forced = reaper("keygen", "--out", str(path), "--force")
    assert forced.returncode == 0, forced
    assert forced.stdout.strip() != line
    assert public_key_text(load_private_key(path)) == forced.stdout.strip()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["operator.pem"]  # no temporary left

    # Without --out no key is made, and none is printed.
    bare = reaper("keygen")
    assert bare.returncode == 2 and "--out FILE is needed" in bare.stderr, bare
    assert bare.stdout == ""


def test_a_bad_key_file_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    junk, missing = tmp_path / "junk.pem", tmp_path / "missing.pem"
    junk.write_text("not a key\n")
    nowhere = "127.0.0.1:1"  # nothing listens: a refusal must come before any connection
    for args in (
        ["drain", "w1", "--reason", "x", "--key-file", str(missing)],
        ["force-reap", "w1", "--reason", "x", "--key-file", str(junk)],
        ["agent", "--worker", "w1", "--state-dir", str(tmp_path / "w1"), "--key-file", str(junk)],
    ):
        out = reaper(*args, "--address", nowhere)
        assert out.returncode == 2, out
        assert out.stderr.startswith("reaper: --key-file ") and out.stderr.count("\n") == 1
    assert not missing.exists()  # an operator's key is never made up
    out = reaper("drain", "w1", "--reason", "x", env={"REAPER_OPERATOR_KEY_FILE": "/nonexistent"})
    assert out.returncode == 2 and "--key-file /nonexistent: no such file" in out.stderr, out


async def test_a_signal_no_controller_answers_for_is_sent_unconfirmed(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    client, w = dev_env.client, f"alone-{uuid.uuid4().hex[:6]}"
    # A liveness started on a task queue no controller polls: it runs, nobody answers queries.
    await send(client, f"tq-none-{uuid.uuid4().hex[:8]}", beat(w, 0))
    out = await run_cli("drain", w, "--reason", "x", "--address", address(dev_env))
    assert out.returncode == 0, out
    assert f"sent drain to liveness-{w}" in out.stdout
    assert "not confirmed" in out.stderr, out.stderr


async def test_operator_commands_sign_with_a_key_file_in_required_mode(
    dev_env: WorkflowEnvironment, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    client, tq, addr = dev_env.client, f"tq-{uuid.uuid4().hex[:8]}", address(dev_env)
    w = f"signed-{uuid.uuid4().hex[:6]}"
    operator_key = keygen(tmp_path / "operator.pem")
    stranger = tmp_path / "stranger.pem"
    keygen(stranger)  # a valid key the controllers do not list
    settings = make_settings(agent_auth="required", operator_keys=operator_key, **SLOW)
    agent_key = new_private_key()
    async with controller(client, pool, settings, tq):
        await send(client, tq, sign_heartbeat(beat(w, 0), agent_key))
        await eventually(
            lambda: query_state(client, w), lambda v: v.last_seq == 0, what="registered"
        )

        # Unsigned: the liveness rejects it, and the command says so.
        out = await run_cli("drain", w, "--reason", "unsigned", "--address", addr)
        assert out.returncode == 1, out
        assert "the controller rejected drain" in out.stderr, out.stderr
        assert "--key-file" in out.stderr and "REAPER_OPERATOR_KEYS" in out.stderr
        view = await query_state(client, w)  # refused by the update's validator: no trace
        assert view.rejected == 0 and not view.draining, view

        # Signed with the operator's key: it acts.
        out = await run_cli(
            "drain",
            w,
            "--reason",
            "kernel upgrade",
            "--key-file",
            str(tmp_path / "operator.pem"),
            "--address",
            addr,
            env={"USER": "alice"},
        )
        assert out.returncode == 0, out
        assert out.stdout.startswith(f"drain of {w}: changed; draining"), out.stdout
        assert operator_key in out.stdout
        await eventually(lambda: query_state(client, w), lambda v: v.draining, what="draining")
        row = await pool.fetchrow(
            "SELECT reason, actor FROM reaper.events WHERE worker = $1 AND action = 'drain'", w
        )
        assert row is not None and (row["reason"], row["actor"]) == ("kernel upgrade", "alice")

        # The key from the environment, as REAPER_OPERATOR_KEY_FILE.
        out = await run_cli(
            "undrain",
            w,
            "--reason",
            "done",
            "--address",
            addr,
            env={"REAPER_OPERATOR_KEY_FILE": str(tmp_path / "operator.pem")},
        )
        assert out.returncode == 0, out
        await eventually(lambda: query_state(client, w), lambda v: not v.draining, what="undrained")

        # Signed by a key the controllers do not list: rejected, and the command says why.
        out = await run_cli(
            "force-reap", w, "--reason", "x", "--key-file", str(stranger), "--address", addr
        )
        assert out.returncode == 1, out
        assert "the controller rejected force_reap" in out.stderr, out.stderr
        assert "REAPER_OPERATOR_KEYS" in out.stderr
        view = await query_state(client, w)
        assert view.rejected == 0 and view.state == "running", view  # by the validators


def _agent(tmp_path: Path, name: str, tq: str, addr: str, *flags: str) -> AgentProcess:
    """``reaper agent`` for worker ``name`` as a child process, its log in ``tmp_path``."""
    argv = ["--worker", name, "--state-dir", str(tmp_path / name)]
    argv += ["--address", addr, "--task-queue", tq, "--heartbeat-interval", "0.2", *flags]
    child = AgentProcess(argv, tmp_path / f"{name}.log")
    child.start()
    return child


async def test_agent_with_a_key_file_registers_and_retires_in_required_mode(
    dev_env: WorkflowEnvironment, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    client, tq, addr = dev_env.client, f"tq-{uuid.uuid4().hex[:8]}", address(dev_env)
    suffix = uuid.uuid4().hex[:6]
    signed, unsigned = f"signed-{suffix}", f"unsigned-{suffix}"
    key_file = tmp_path / "keys" / f"agent-{signed}.pem"
    agents = {
        signed: _agent(tmp_path, signed, tq, addr, "--key-file", str(key_file), "--retire-on-stop"),
        unsigned: _agent(tmp_path, unsigned, tq, addr),
    }
    settings = make_settings(agent_auth="required", **FAST)
    try:
        async with controller(client, pool, settings, tq):
            view = await eventually(
                lambda: _state_or_none(client, signed),
                lambda v: v is not None and v.state == "running" and v.last_seq is not None,
                timeout=30,
                what=f"{signed} running",
            )
            assert view is not None and view.rejected == 0, view
            # Created on the first start, 0600, and pinned as the worker's key.
            assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
            public = public_key_text(load_private_key(key_file))
            pinned = await eventually(
                lambda: pool.fetchval(
                    "SELECT public_key FROM reaper.agent_keys WHERE worker = $1", signed
                ),
                lambda k: k is not None,
                what="key pinned",
            )
            assert pinned == public
            assert public in (tmp_path / f"{signed}.log").read_text()

            # Unsigned in `required` mode: every beat is rejected, no worker is registered.
            view = await eventually(
                lambda: _state_or_none(client, unsigned),
                lambda v: v is not None and v.rejected >= 3,
                timeout=30,
                what=f"{unsigned}'s beats rejected",
            )
            assert view is not None and view.last_seq is None and view.boot_id is None, view
            assert "unsigned" in (view.last_rejection or ""), view
            row = await pool.fetchval("SELECT 1 FROM reaper.workers WHERE name = $1", unsigned)
            assert row is None

            # The agent learns it from its own `state` query, which may wait behind a busy
            # workflow task (a fresh clone's CI run: "consistent query buffer is full", the
            # log read before its answer came): read its log until it says so.
            async def unsigned_log() -> str:
                return (tmp_path / f"{unsigned}.log").read_text()

            await eventually(
                unsigned_log,
                lambda log: "the controller rejects beats" in log and "--key-file" in log,
                timeout=30,
                what=f"{unsigned}'s agent saying its beats are rejected",
            )

            # Its retire on stop is signed with the worker's own key: accepted.
            child = agents[signed]
            child.signal(signal.SIGTERM)
            assert child.proc is not None
            code = await asyncio.to_thread(child.proc.wait, 15)
            assert code == 0, (tmp_path / f"{signed}.log").read_text()
            await eventually(
                lambda: pool.fetchval("SELECT state FROM reaper.workers WHERE name = $1", signed),
                lambda st: st == "retired",
                what=f"{signed} retired",
            )
            reason = await pool.fetchval(
                "SELECT reason FROM reaper.events WHERE worker = $1 AND kind = 'worker'"
                " AND action = 'state' AND reason LIKE '%-> retired%'",
                signed,
            )
            assert RETIRE_ON_STOP_REASON in reason
    finally:
        for child in agents.values():
            child.stop()
