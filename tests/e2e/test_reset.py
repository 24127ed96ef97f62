"""``reaper reset`` (issue 35, item 3): it deletes the embedded stack's state directory, and
refuses while a real embedded Postgres or Temporal dev server runs on it, when the directory
holds anything that is not the stack's, and without ``--yes`` off a terminal."""

from __future__ import annotations

from pathlib import Path

from reaper.kit.postgres import EmbeddedPostgres
from reaper.kit.temporal import DevServer
from tests.support.cli import reaper


def stack_dir(root: Path) -> Path:
    """A state directory as `reaper run` leaves it (its files; nothing running)."""
    state = root / "state"
    (state / "postgres").mkdir(parents=True)
    (state / "postgres" / "PG_VERSION").write_text("18\n")
    (state / "temporal.db").write_bytes(b"")
    (state / "temporal.log").write_text("")
    (state / "artifacts" / "web-ui").mkdir(parents=True)
    return state


def reset(state: Path, *args: str):
    return reaper("reset", "--state-dir", str(state), *args)


def test_reset_deletes_the_stacks_state_and_says_so(tmp_path: Path) -> None:
    state = stack_dir(tmp_path)
    out = reset(state)  # not a terminal: it does not ask
    assert out.returncode == 2 and "give --yes" in out.stderr, out
    assert state.exists()
    out = reset(state, "--yes")
    assert out.returncode == 0, out
    assert out.stdout.startswith(f"deleted {state}: the next `reaper run`"), out.stdout
    assert not state.exists()
    out = reset(state, "--yes")
    assert out.returncode == 0 and "nothing to reset" in out.stdout, out


def test_reset_never_empties_a_directory_that_is_not_the_stacks(tmp_path: Path) -> None:
    state = stack_dir(tmp_path)
    (state / "notes.txt").write_text("mine")
    out = reset(state, "--yes")
    assert out.returncode == 1, out
    assert "holds files that are not reaper's (notes.txt)" in out.stderr, out
    assert (state / "notes.txt").exists() and (state / "temporal.db").exists()


async def test_reset_refuses_while_the_stack_runs_on_it(tmp_path: Path) -> None:
    state = stack_dir(tmp_path)
    (state / "postgres").rename(tmp_path / "unused")
    (state / "temporal.db").unlink()  # the dev server makes its own
    postgres = EmbeddedPostgres(state / "postgres")
    postgres.start()
    try:
        out = reset(state, "--yes")
        assert out.returncode == 1, out
        assert "`reaper run` is still running" in out.stderr
        assert "its Postgres is running" in out.stderr, out
    finally:
        postgres.stop()
    temporal = DevServer(state / "temporal.log", db_file=state / "temporal.db")
    await temporal.up()
    try:
        out = reset(state, "--yes")
        assert out.returncode == 1, out
        assert f"a Temporal dev server uses its temporal.db (pid {temporal.pid})" in out.stderr
    finally:
        temporal.stop()
    assert (state / "postgres").is_dir()
    out = reset(state, "--yes")
    assert out.returncode == 0 and not state.exists(), out
