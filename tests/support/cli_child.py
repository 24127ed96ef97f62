"""The child side of :func:`tests.support.cli.reaper`: one ``python -m reaper.cli ARGS``, run
in a process forked from a server that has imported ``reaper.cli`` already.

Standard library only at import: the fork server preloads this module beside ``reaper.cli``.
"""

from __future__ import annotations

import importlib
import io
import os
import runpy
import signal
import sys


def run(args: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """What ``python -m reaper.cli ARGS`` does in a fresh process with environment ``env``,
    working directory ``cwd``, no standard input, and its output in the files ``out`` and
    ``err``; its exit status is this process's."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    os.close(stdin)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        write_through=True,
    )
    # The fork server built the CLI's consoles with its own environment, and rich reads
    # COLUMNS when a console is built: give them this command's width (80 without one, as a
    # fresh process writing to a file has).
    app = importlib.import_module("reaper.cli.app")
    columns = env.get("COLUMNS", "")
    for console in (app.console, app.err):
        console.width = int(columns) if columns.isdigit() else 80
    sys.argv = ["reaper", *args]
    try:
        runpy.run_module("reaper.cli", run_name="__main__", alter_sys=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
