"""Patches retire only by the rule of docs/architecture.md ("Replay and patches"), and the
CHANGELOG names each one (issue 18).

- Every patch id the code passes to ``workflow.patched`` or ``workflow.deprecate_patch`` is
  named in CHANGELOG.md.
- A patch id leaves the code only after a release called ``workflow.deprecate_patch`` on it:
  checked from the baseline (082a540, the oldest code whose histories replay) through every
  listed release older than the code under test to the code under test, read from git.
- Each release's ``### Workflow patches`` list says what its code holds (``In use``) and what
  changed since the release before it (``Added``, ``Deprecated``, ``Retired``); so does the
  section of the code under test (``## Unreleased``, or the next version) whenever its
  patches differ from the previous release's.
- Every stored history of the previous release (the upgrade test's,
  tests/e2e/test_upgrade.py) is there, covers the four workflow types, and replays.

Tests that read old commits skip with one line where git or the history is not available.
"""

from __future__ import annotations

from itertools import pairwise

import pytest

from tests.support.releases import (
    BASELINE,
    CHANGELOG,
    HISTORY_KINDS,
    PatchIds,
    Release,
    Unavailable,
    changelog_patches,
    find_previous_release,
    head,
    ids_named,
    is_ancestor,
    load_releases,
    older_releases,
    patch_ids,
    previous_release,
    release_histories,
    removals_breaking_the_rule,
    replay_stored,
    resolve,
    sources_at,
    sources_here,
)

# ---- the previous release --------------------------------------------------------------

LINE = ["a" * 40, "b" * 40, "c" * 40, "d" * 40]
"""A linear history, oldest first."""


def _ancestor(a: str, b: str) -> bool:
    """``git merge-base --is-ancestor`` on ``LINE`` (abbreviated ids allowed)."""
    at = [next((i for i, c in enumerate(LINE) if c.startswith(x)), None) for x in (a, b)]
    return None not in at and at[0] <= at[1]  # type: ignore[operator]


RELEASES = [Release("1.0.0", LINE[0], ""), Release("1.1.0", LINE[2][:7], "")]


@pytest.mark.parametrize(
    ("releases", "head_commit", "expected"),
    [
        (RELEASES, LINE[3], "1.1.0"),  # after the newest release
        (RELEASES, LINE[2], "1.0.0"),  # on a release (abbreviated in the list): the one before
        (RELEASES, LINE[1], "1.0.0"),
        (RELEASES, LINE[0], None),  # on the first release: the baseline
        ([], LINE[3], None),  # no release yet
        ([Release("9.0.0", "e" * 40, "")], LINE[3], None),  # a release not in this history
    ],
)
def test_the_previous_release_is_the_newest_listed_one_older_than_the_code(
    releases, head_commit, expected
):
    found = previous_release(releases, head_commit, _ancestor)
    assert found.version == expected
    if expected is None:
        assert found == BASELINE


# ---- patch ids ---------------------------------------------------------------------------


def test_patch_ids_are_read_from_literals_and_module_constants():
    sources = {
        "a.py": 'X = "x-id"\ndef f():\n    workflow.patched(X)\n    workflow.patched("lit")\n',
        "b.py": "from a import X\ndef g():\n    workflow.deprecate_patch(a.X)\n",
    }
    assert patch_ids(sources) == PatchIds(frozenset({"x-id", "lit"}), frozenset({"x-id"}))
    with pytest.raises(ValueError, match=r"c\.py:2"):
        patch_ids({"c.py": "def h(i):\n    workflow.patched(i)\n"})


def test_a_patch_may_leave_only_after_a_release_deprecated_it():
    before = PatchIds(frozenset({"kept", "dropped"}), frozenset({"old"}))
    assert removals_breaking_the_rule(before, PatchIds(frozenset({"kept"}), frozenset())) == {
        "dropped"
    }
    deprecated = PatchIds(frozenset({"kept"}), frozenset({"dropped"}))
    assert removals_breaking_the_rule(before, deprecated) == set()
    assert removals_breaking_the_rule(deprecated, PatchIds(frozenset({"kept"}), frozenset())) == (
        set()
    )


def test_every_patch_id_in_the_code_is_named_in_the_changelog():
    ids = patch_ids(sources_here()).all
    assert ids, "no workflow.patched call found: the scan is broken"
    missing = ids - ids_named(CHANGELOG.read_text(), ids)
    assert not missing, f"patch ids in the code but not in CHANGELOG.md: {sorted(missing)}"


# ---- through the releases (git) ----------------------------------------------------------


def _chain() -> list[tuple[Release, PatchIds]]:
    """The baseline, every listed release older than the code under test, and the code under
    test (version ``None``, commit ``HEAD``), each with its patch ids."""
    try:
        current = head()
        older = older_releases(load_releases(), current, is_ancestor)
        chain = [(BASELINE, patch_ids(sources_at(resolve(BASELINE.commit))))]
        chain += [(r, patch_ids(sources_at(r.commit))) for r in older]
    except Unavailable as exc:
        pytest.skip(f"the patch rule needs the repository's history: {exc}")
    return [*chain, (Release(None, current, ""), patch_ids(sources_here()))]


def test_no_patch_id_left_the_code_without_a_release_that_deprecated_it():
    chain = _chain()
    for (before, ids_before), (after, ids_after) in pairwise(chain):
        broken = removals_breaking_the_rule(ids_before, ids_after)
        where = after.name if after.version else "the code under test"
        assert not broken, (
            f"{where} removed patch ids {sorted(broken)} that {before.name} still called with"
            " workflow.patched: deprecate them in one release (workflow.deprecate_patch),"
            " remove them in a later one (docs/architecture.md, 'Replay and patches')"
        )


def _changes(before: PatchIds, after: PatchIds) -> dict[str, set[str]]:
    return {
        "Added": set(after.all - before.all),
        "Deprecated": set(after.deprecated - before.deprecated),
        "Retired": set(before.all - after.all),
    }


def test_the_changelog_lists_each_releases_patches():
    chain = _chain()
    sections = changelog_patches(CHANGELOG.read_text())
    released = chain[1:-1]
    for (_, ids_before), (release, ids) in zip(chain, released, strict=False):
        assert release.version in sections, f"CHANGELOG.md has no section ## {release.version}"
        listed = sections[release.version]
        assert listed["In use"] == set(ids.all), (release.version, "In use", listed, ids)
        for what, expected in _changes(ids_before, ids).items():
            assert listed[what] == expected, (release.version, what, listed[what], expected)
    # The code under test: its section, if its patches changed since the previous release.
    (_, ids_before), (_, ids_now) = chain[-2], chain[-1]
    changes = _changes(ids_before, ids_now)
    if any(changes.values()):
        top = next(iter(sections), None)
        assert top is not None and top not in {r.version for r, _ in released}, (
            f"the code's patches changed since the previous release ({changes}): describe them"
            " under a new '## Unreleased' section of CHANGELOG.md"
        )
        for what, expected in changes.items():
            assert sections[top][what] == expected, (top, what, sections[top][what], expected)


async def test_every_stored_history_of_the_previous_release_replays():
    try:
        previous = find_previous_release()
    except Unavailable as exc:
        pytest.skip(f"the previous release needs the repository's history: {exc}")
    if previous.version is None:
        pytest.skip(f"the previous release is the baseline {previous.commit}: no release yet")
    stored = release_histories(previous.version)
    kinds = {p.stem.removeprefix(f"release-{previous.version}-").split("-")[0] for p in stored}
    assert kinds >= set(HISTORY_KINDS), (
        f"stored histories of {previous.name}: {[p.name for p in stored]}; record them with"
        " REAPER_RECORD_HISTORIES=1 pytest -m upgrade -k sequential tests/e2e/test_upgrade.py"
    )
    for path in stored:
        failure = await replay_stored(path)
        assert failure is None, (path.name, failure)
