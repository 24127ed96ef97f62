"""The README and docs/ stay true to the code (static; the worked example of the agent guide
is run by test_agent_protocol_doc.py, the stale clock's reproduction by
test_stale_clock_repro.py).

Every setting (Settings fields and the contract's variables) is documented with its real
default; the alert runbook anchors exist; every ``reaper`` command and flag the guides and the
README use exists; internal links and anchors of every page resolve; the README links every
page of docs/ right after its two commands; nothing refers to files outside the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main

from reaper.cli.app import app
from reaper.core.config import Settings
from reaper.core.config_values import parse_duration
from tests.support.compose import contract_variables
from tests.support.paths import ROOT

OPERATOR = ROOT / "docs" / "operator-guide.md"
AGENT = ROOT / "docs" / "agent-protocol.md"
RUNTIMES = ROOT / "docs" / "agent-runtimes.md"
GUIDES = (OPERATOR, AGENT, RUNTIMES)
README = ROOT / "README.md"
PAGES = (
    README,
    ROOT / "CHANGELOG.md",
    ROOT / "BENCHMARKS.md",
    *sorted((ROOT / "docs").glob("*.md")),
)
"""Every Markdown page of the project: the README, the changelog, the benchmarks and docs/."""
RUNBOOKS = (
    "runbook-lost-worker",
    "runbook-fleet-disruption",
    "runbook-owed-replacements",
    "runbook-rejected-heartbeats",
    "runbook-controller-down",
    "runbook-forced-reap",
    "runbook-retirement",
    "runbook-stuck-liveness",
)
"""The anchors the alert rules link to (deploy/prometheus/alerts.yml)."""
_ROW = re.compile(r"^\| `(REAPER_[A-Z0-9_]+)` \| ([^|]*) \|", re.MULTILINE)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    headings = {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}
    return headings | set(re.findall(r'<a id="([^"]+)"></a>', text))


def code(text: str) -> list[str]:
    """The fenced blocks' lines and the inline code spans of a Markdown text."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    prose = re.sub(r"^```[a-z]*\n.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)
    spans = re.findall(r"`([^`]+)`", prose.replace("\n", " "))
    return [line for block in blocks for line in block.splitlines()] + spans


def documented_defaults() -> dict[str, str]:
    return {name: default.strip() for name, default in _ROW.findall(OPERATOR.read_text("utf-8"))}


def test_every_setting_is_documented() -> None:
    documented = documented_defaults()
    fields = {f"REAPER_{name.upper()}" for name in Settings.model_fields}
    missing = (fields | set(contract_variables())) - set(documented)
    assert not missing, f"not in docs/operator-guide.md: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_documented_default_is_the_real_default(name: str) -> None:
    documented = documented_defaults()[f"REAPER_{name.upper()}"]
    field = Settings.model_fields[name]
    value = re.fullmatch(r"`([^`]*)`", documented)
    if field.default_factory is not None:  # derived from the host (REAPER_CONTROLLERS)
        assert value is None and "core" in documented, f"{name}: documented {documented}"
        return
    if field.default is None or field.default == ():
        assert value is None, f"{name}: documented {documented}, the default is unset"
        return
    assert value, f"{name}: the default {field.default!r} is not shown as `value`"
    if isinstance(field.default, bool):
        assert value.group(1) == str(field.default).lower(), name
    elif isinstance(field.default, (int, float)):
        assert parse_duration(value.group(1)) == float(field.default), name
    else:
        assert value.group(1) == field.default, name


def test_documented_defaults_agree_with_the_contract() -> None:
    documented = documented_defaults()
    for name, default in contract_variables().items():
        if default is not None:
            assert documented[name] == f"`{default}`", name


def test_runbook_anchors_exist() -> None:
    text = OPERATOR.read_text(encoding="utf-8")
    for anchor in RUNBOOKS:
        assert f'<a id="{anchor}"></a>' in text, anchor
        assert anchor in {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}


@pytest.mark.parametrize("guide", PAGES, ids=lambda p: p.name)
def test_links_resolve(guide: Path) -> None:
    text = guide.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        doc = (guide.parent / path).resolve() if path else guide
        assert doc.exists(), f"{guide.name}: {target}"
        if anchor:
            assert anchor in anchors(doc.read_text(encoding="utf-8")), f"{guide.name}: {target}"


@pytest.mark.parametrize("guide", (*GUIDES, README), ids=lambda p: p.name)
def test_reaper_commands_and_flags_exist(guide: Path) -> None:
    cli = typer.main.get_command(app)
    commands = cli.commands  # type: ignore[attr-defined]
    uses = 0
    # `reaper CMD ...` in inline code and code blocks, up to the end of that command.
    for snippet in code(guide.read_text(encoding="utf-8")):
        for match in re.finditer(r"(?:^|[\s(])reaper ([a-z][a-z-]*)([^|;&#]*)", snippet):
            name, rest = match.groups()
            assert name in commands, f"{guide.name}: `reaper {name}` is not a command"
            options = {"--help"} | {opt for p in commands[name].params for opt in p.opts}
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-v)\b", rest):
                assert flag in options, f"{guide.name}: `reaper {name}` has no {flag}"
            uses += 1
    assert uses >= (10 if guide == OPERATOR else 2)


def test_readme_links_the_docs_after_its_two_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = re.search(r"```sh\n(.*?)```", readme, re.DOTALL)
    assert first_block
    assert [line.split()[:2] for line in first_block.group(1).splitlines()] == [
        ["make", "run"],
        ["make", "test"],
    ]
    docs = readme.index("## Documentation")
    assert first_block.end() < docs < readme.index("## What reaper is")
    section = readme[docs : readme.index("## What reaper is")]
    assert "(docs/operator-guide.md)" in section and "(docs/agent-protocol.md)" in section
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in section, f"the README does not link docs/{page.name}"


OUTSIDE = ("../shared", "TEMPORAL.md", "ENV.md", "STYLE.md")
"""Files beside the checkout that the project once pointed at; it must stand alone."""
ALLOWED_OUTSIDE = {
    Path("tests/core/test_contract_doc.py"),  # compares docs/CONTRACT.md with the shared one
    Path("tests/e2e/test_docs.py"),  # this list
}


def test_nothing_refers_to_files_outside_the_repository() -> None:
    kinds = {".py", ".md", ".toml", ".yml", ".yaml", ".json", ".sql", ".sh", ".txt"}
    skip = {".git", ".venv", ".reaper", "node_modules"}
    found = []
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if skip & set(rel.parts) or not path.is_file() or rel in ALLOWED_OUTSIDE:
            continue
        if path.suffix not in kinds and path.name not in {"Makefile", "Dockerfile"}:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [f"{rel}: {name}" for name in OUTSIDE if name in text]
    assert not found, found
