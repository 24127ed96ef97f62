"""Releases of reaper as the repository records them (``releases.toml``, CHANGELOG.md), the
previous release of the code under test, its code exported from git, and the workflow patch
ids a tree of code calls.

What the upgrade test (tests/e2e/test_upgrade.py) and the patch rule
(tests/workflows/test_releases.py) share. Git is needed only to read old commits; without
it (or without the commit: a shallow clone) :class:`Unavailable` says why in one line.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import tarfile
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.support.paths import ROOT

RELEASES_TOML = ROOT / "releases.toml"
CHANGELOG = ROOT / "CHANGELOG.md"
PRODUCT_DIRS = ("workflows", "activities", "reaper")
"""Where workflow code may call ``workflow.patched`` (and ``worker.py``)."""


@dataclass(frozen=True)
class Release:
    """A released commit of main (``releases.toml``); ``version`` is ``None`` for the
    baseline below (code deployed before releases existed)."""

    version: str | None
    commit: str
    date: str

    @property
    def name(self) -> str:
        return f"release {self.version} ({self.commit[:7]})" if self.version else self.commit


BASELINE = Release(version=None, commit="082a540", date="2026-12-02")
"""The previous release while no listed release is older than the code under test: the
oldest code whose histories the current code promises to replay (issue 18)."""


class Unavailable(Exception):
    """Git, the repository's history or a commit is not available here (one line: why)."""


def load_releases(path: Path = RELEASES_TOML) -> list[Release]:
    """The releases listed in ``releases.toml``, oldest first (as listed)."""
    data = tomllib.loads(path.read_text())
    return [
        Release(version=str(r["version"]), commit=str(r["commit"]), date=str(r["date"]))
        for r in data.get("release", [])
    ]


def older_releases(
    releases: list[Release], head: str, is_ancestor: Callable[[str, str], bool]
) -> list[Release]:
    """The listed releases older than the code under test (``head``, a full commit id):
    each a commit that is an ancestor of ``head`` and not ``head`` itself; oldest first.

    Args:
        releases: as :func:`load_releases`, oldest first.
        is_ancestor: ``is_ancestor(a, b)``: whether commit ``a`` is an ancestor of ``b``.
    """
    return [r for r in releases if not head.startswith(r.commit) and is_ancestor(r.commit, head)]


def previous_release(
    releases: list[Release],
    head: str,
    is_ancestor: Callable[[str, str], bool],
    baseline: Release = BASELINE,
) -> Release:
    """The newest listed release older than the code under test (:func:`older_releases`;
    if ``head`` is itself a release, the one before it), or ``baseline`` while there is
    none."""
    older = older_releases(releases, head, is_ancestor)
    return older[-1] if older else baseline


# ---- git --------------------------------------------------------------------------------


def git(*args: str) -> str:
    """Run git in the repository; its stdout, stripped.

    Raises:
        Unavailable: no git, no repository, or the command failed (the message says which).
    """
    exe = shutil.which("git")
    if exe is None:
        raise Unavailable("git is not installed")
    done = subprocess.run(
        [exe, "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        err = done.stderr.strip().splitlines()
        raise Unavailable(f"git {' '.join(args)}: {err[-1] if err else done.returncode}")
    return done.stdout.strip()


def head() -> str:
    """The full id of the commit checked out (the code under test)."""
    return git("rev-parse", "HEAD")


def resolve(commit: str) -> str:
    """The full id of ``commit``.

    Raises:
        Unavailable: the commit is not in this clone (a shallow clone, a foreign commit).
    """
    try:
        return git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    except Unavailable:
        raise Unavailable(f"commit {commit} is not in this clone's history") from None


def is_ancestor(a: str, b: str) -> bool:
    """Whether commit ``a`` is an ancestor of ``b`` (False if either is unknown)."""
    exe = shutil.which("git")
    if exe is None:
        return False
    done = subprocess.run(
        [exe, "-C", str(ROOT), "merge-base", "--is-ancestor", a, b],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return done.returncode == 0


def find_previous_release() -> Release:
    """The previous release of the code checked out, its commit resolved to a full id.

    Raises:
        Unavailable: git, the history or the release's commit is not available.
    """
    release = previous_release(load_releases(), head(), is_ancestor)
    return Release(release.version, resolve(release.commit), release.date)


def export(commit: str, dest: Path) -> Path:
    """The tree of ``commit`` written under ``dest`` (``git archive``), as a release is
    installed from a clean checkout; returns ``dest``.

    Raises:
        Unavailable: git or the commit is not available.
    """
    full = resolve(commit)
    exe = shutil.which("git")
    assert exe is not None
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest.parent / f"{full[:12]}.tar"
    with open(archive, "wb") as out:
        done = subprocess.run(
            [exe, "-C", str(ROOT), "archive", full], stdout=out, timeout=120, check=False
        )
    if done.returncode != 0:
        raise Unavailable(f"git archive {full[:12]} failed ({done.returncode})")
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()
    return dest


def sources_at(commit: str) -> dict[str, str]:
    """The product code (``PRODUCT_DIRS`` and ``worker.py``) at ``commit``: path -> text.

    Raises:
        Unavailable: git or the commit is not available.
    """
    full = resolve(commit)
    paths = git("ls-tree", "-r", "--name-only", full, "--", *PRODUCT_DIRS, "worker.py")
    return {p: git("show", f"{full}:{p}") for p in paths.splitlines() if p.endswith(".py") and p}


def sources_here() -> dict[str, str]:
    """The product code of the working tree (the code under test): path -> text."""
    files = [ROOT / "worker.py"] + [f for d in PRODUCT_DIRS for f in (ROOT / d).rglob("*.py")]
    return {str(f.relative_to(ROOT)): f.read_text() for f in files if f.exists()}


# ---- stored histories -------------------------------------------------------------------

HISTORIES = ROOT / "tests" / "workflows" / "histories"
"""Stored histories replayed against the current code (tests/workflows/test_replay.py)."""
HISTORY_KINDS = ("liveness", "collector", "fleet", "reap")
"""What the stored histories of a release cover: one workflow type each, at least."""


def release_histories(version: str) -> list[Path]:
    """The stored histories a release's controller wrote: ``release-{version}-*.json``,
    recorded by tests/e2e/test_upgrade.py (``REAPER_RECORD_HISTORIES=1``)."""
    return sorted(HISTORIES.glob(f"release-{version}-*.json"))


async def replay_stored(path: Path) -> BaseException | None:
    """Replay one stored history on the code under test; its failure, or ``None``.

    A liveness checks that it runs under its own id (``liveness-{worker}``): it is replayed
    under the id its start input names; any other workflow under ``stored-{file name}``.
    """
    from temporalio.client import WorkflowHistory
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Replayer

    from reaper.core.contract import liveness_id
    from workflows import ALL_WORKFLOWS

    raw = path.read_text()
    start = (
        WorkflowHistory.from_json("x", raw).events[0].workflow_execution_started_event_attributes
    )
    wid = f"stored-{path.stem}"
    if start.workflow_type.name == "WorkerLiveness":
        worker = json.loads(start.input.payloads[0].data).get("worker", "")
        wid = liveness_id(worker)
    replayer = Replayer(workflows=ALL_WORKFLOWS, data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(
        WorkflowHistory.from_json(wid, raw), raise_on_replay_failure=False
    )
    return result.replay_failure


# ---- workflow patch ids ------------------------------------------------------------------

PATCH_CALLS = {"patched": "patched", "deprecate_patch": "deprecated"}


@dataclass(frozen=True)
class PatchIds:
    """The patch ids a tree of code calls: ``workflow.patched(id)`` and
    ``workflow.deprecate_patch(id)``."""

    patched: frozenset[str]
    deprecated: frozenset[str]

    @property
    def all(self) -> frozenset[str]:
        return self.patched | self.deprecated


def _constants(trees: Mapping[str, ast.Module]) -> dict[str, set[str]]:
    """Module-level ``NAME = "text"`` assignments of every file: name -> the texts."""
    found: dict[str, set[str]] = {}
    for tree in trees.values():
        for node in tree.body:
            targets: list[ast.expr] = []
            value: ast.expr | None = None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                for t in targets:
                    if isinstance(t, ast.Name):
                        found.setdefault(t.id, set()).add(value.value)
    return found


def patch_ids(sources: Mapping[str, str]) -> PatchIds:
    """Every patch id that ``sources`` (path -> Python text) pass to ``workflow.patched`` or
    ``workflow.deprecate_patch``: a string literal, or a module-level constant of the tree
    (``CHANGE_FEED = "change-feed"``), bare or as ``module.NAME``.

    Raises:
        ValueError: a call whose id is neither (the message names the file and line): the
            rule cannot be checked for it.
    """
    trees = {path: ast.parse(text, filename=path) for path, text in sources.items()}
    constants = _constants(trees)
    ids: dict[str, set[str]] = {"patched": set(), "deprecated": set()}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name not in PATCH_CALLS:
                continue
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                value = {arg.value}
            else:
                ref = arg.attr if isinstance(arg, ast.Attribute) else getattr(arg, "id", None)
                value = constants.get(ref or "", set())
            if len(value) != 1:
                raise ValueError(
                    f"{path}:{node.lineno}: {name}() with an id that is not a string literal "
                    "or one module-level constant: the patch rule cannot read it"
                )
            ids[PATCH_CALLS[name]] |= value
    return PatchIds(frozenset(ids["patched"]), frozenset(ids["deprecated"]))


def removals_breaking_the_rule(before: PatchIds, after: PatchIds) -> set[str]:
    """Patch ids that ``before`` calls with ``workflow.patched`` and ``after`` no longer
    calls at all: removed without a release that deprecated them first
    (docs/architecture.md, "Replay and patches")."""
    return set(before.patched - after.all)


# ---- CHANGELOG.md ------------------------------------------------------------------------

PATCH_LISTS = ("In use", "Added", "Deprecated", "Retired")
"""The bullets of a release's ``### Workflow patches`` list in CHANGELOG.md."""
_SECTION = re.compile(r"^## (\S+)", re.M)
_BULLET = re.compile(r"^- (In use|Added|Deprecated|Retired)\b(.*?)(?=^- |^#|\Z)", re.M | re.S)
_ID = re.compile(r"`([a-z0-9][a-z0-9-]*)`")


def changelog_patches(text: str) -> dict[str, dict[str, set[str]]]:
    """The ``### Workflow patches`` list of each ``## <version>`` (or ``## Unreleased``)
    section of CHANGELOG.md: version -> {"In use"|"Added"|"Deprecated"|"Retired": ids},
    an id being a backticked ``lower-case-word`` in that bullet; a bullet left out is
    empty."""
    sections: dict[str, dict[str, set[str]]] = {}
    heads = list(_SECTION.finditer(text))
    for i, m in enumerate(heads):
        body = text[m.end() : heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        at = body.find("### Workflow patches")
        lists: dict[str, set[str]] = {
            k: set() for k in ("In use", "Added", "Deprecated", "Retired")
        }
        if at >= 0:
            block = body[at:].split("\n### ", 1)[0].split("\n", 1)[-1]
            for b in _BULLET.finditer(block):
                lists[b.group(1)] |= set(_ID.findall(b.group(2)))
        sections[m.group(1)] = lists
    return sections


def ids_named(text: str, ids: Iterable[str]) -> set[str]:
    """Those of ``ids`` that ``text`` names in backticks."""
    return {i for i in ids if f"`{i}`" in text}
