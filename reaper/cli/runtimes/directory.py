"""The ``directory`` runtime: a host's handles as the entries of a state directory.

The directory holds ``containers/``, ``volumes/`` and ``tasks/`` (created if missing); each
entry's name is a handle (names starting with ``.`` are ignored, so a tool can write ``.tmp``
files and rename them). Starting a task creates ``tasks/<id>``; removing an orphan deletes
its entry, file or tree. This is the reference agent's behaviour since v1, the default of
``reaper agent``, the demo and the tests that need no container engine.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from reaper.cli.runtimes import Inventory
from reaper.core.contract import KINDS

log = logging.getLogger("reaper.agent")


def list_entries(directory: Path) -> list[str]:
    """Names of the entries of ``directory`` (dot-files excluded), sorted."""
    try:
        return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))
    except FileNotFoundError:
        return []


def remove_entry(path: Path) -> bool:
    """Remove a file or a directory tree; True if something was removed."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        return True
    except FileNotFoundError:
        return False


def _unsafe(name: str) -> bool:
    """A name that is not one entry of its directory (it would escape it)."""
    return "/" in name or name in (".", "..")


class DirectoryRuntime:
    """Handles as entries of ``state_dir/<kind>/`` (created on construction)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        for kind in KINDS:
            (self.state_dir / kind).mkdir(parents=True, exist_ok=True)

    def describe(self) -> str:
        """``state in <dir>``."""
        return f"state in {self.state_dir}"

    def snapshot(self) -> Inventory:
        """The complete lists of handles held now, per kind (read synchronously)."""
        return {kind: list_entries(self.state_dir / kind) for kind in KINDS}

    async def inventory(self) -> Inventory:
        """:meth:`snapshot`: a directory always answers."""
        return self.snapshot()

    async def remove(self, kind: str, handle: str) -> bool:
        """Delete ``<kind>/<handle>``; names that would escape the directory are ignored."""
        if kind not in KINDS or _unsafe(handle):
            return False
        if remove_entry(self.state_dir / kind / handle):
            log.info("removed orphan %s/%s", kind, handle)
            return True
        return False

    async def start(self, task_id: str) -> bool:
        """Create ``tasks/<task_id>`` unless it exists."""
        path = self.state_dir / "tasks" / task_id
        if _unsafe(task_id) or path.exists():
            return False
        path.touch()
        log.info("started task %s", task_id)
        return True

    async def close(self) -> None:
        """Nothing to release."""
