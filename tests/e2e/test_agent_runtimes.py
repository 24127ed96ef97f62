"""The agent's runtimes without an engine: ownership by labels, task templates, and what a
beat carries when a list could not be read (CONTRACT.md §2: ``null``, never ``[]``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reaper.cli.agent import Agent
from reaper.cli.runtimes.holding import HOLDS_TASK, holds_task, report_lists
from reaper.cli.runtimes.labels import Owned, labels_for, owned
from reaper.cli.runtimes.starter import engine_name
from reaper.cli.runtimes.templates import TemplateError, Templates, fill, service_of
from tests.support.paths import ROOT


def test_only_the_workers_labelled_objects_are_its_own() -> None:
    assert owned("id", labels_for("w1", handle="c-1"), "w1") == Owned("id", "c-1", None)
    assert owned("id", labels_for("w1", task="t-1"), "w1", "exited") == Owned(
        "id", None, "t-1", "exited"
    )
    assert owned("id", labels_for("w2", handle="c-1"), "w1") is None  # another worker's
    assert owned("id", {"reaper.handle": "c-1"}, "w1") is None  # no worker label
    assert owned("id", {"reaper.worker": "w1"}, "w1") is None  # neither handle nor task
    assert owned("id", {"reaper.worker": "w1", "reaper.handle": ""}, "w1") is None
    assert owned("id", None, "w1") is None


def test_a_tasks_service_is_the_longest_matching_template() -> None:
    services = ["web", "web-api", "db"]
    assert service_of("web-1", services) == "web"
    assert service_of("web-api-4d05071d84d0", services) == "web-api"
    assert service_of("web", services) == "web"
    assert service_of("webx-1", services) is None and service_of("cache-1", services) is None


def test_the_demo_template_loads_and_bad_ones_say_why(tmp_path: Path) -> None:
    t = Templates(ROOT / "deploy" / "agent-templates").load("web")
    assert t.image == "localhost/reaper-busybox:1" and t.limits.nofile == 1024
    assert t.runtime == "runc" and t.network == "none" and t.name == "{task}"
    cases = {
        "typo": 'image = "x"\nimgae = "y"\n',
        "reserved": 'image = "x"\nlabels = { "reaper.task" = "t" }\n',
        "relative": 'image = "x"\nvolumes = { "d" = "data" }\n',
        "noimage": 'command = ["true"]\n',
        "nottoml": "image = \n",
    }
    for name, text in cases.items():
        (tmp_path / f"{name}.toml").write_text(text)
        with pytest.raises(TemplateError, match=f"{name}.toml"):
            Templates(tmp_path).load(name)
    with pytest.raises(TemplateError, match="no template"):
        Templates(tmp_path).load("absent")
    with pytest.raises(TemplateError, match="--templates"):
        Templates(None).load("web")


def test_placeholders_are_replaced_and_nothing_else_is_interpreted() -> None:
    assert fill("{task}-data", "web-1", "web", "w1") == "web-1-data"
    assert fill("{service}@{worker}", "t", "web", "w1") == "web@w1"
    assert fill("{0} {task.__class__}", "t", "s", "w") == "{0} {task.__class__}"
    assert engine_name("web-1_data.2") == "web-1_data.2"
    for bad in ("-web", "web/1", "wéb", "a" * 129, ""):
        with pytest.raises(TemplateError):
            engine_name(bad)


def test_a_list_that_could_not_be_read_is_null_not_empty(tmp_path: Path) -> None:
    agent = Agent(worker="w1", task_queue="q", interval=1, client_factory=None, state_dir=tmp_path)  # type: ignore[arg-type]
    [beat] = agent.next_beats({"containers": None, "volumes": [], "tasks": None})
    assert "containers" not in beat and "tasks" not in beat and beat["volumes"] == []
    with pytest.raises(ValueError, match="runtime or a state_dir"):
        Agent(worker="w1", task_queue="q", interval=1, client_factory=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "holds"),
    [
        ("created", True),  # starting
        ("restarting", True),
        ("running", True),
        ("paused", True),  # an operator's pause: resumed, not replaced
        ("removing", False),
        ("exited", False),  # on its own, stopped, or killed by the engine
        ("dead", False),
        ("configured", True),  # Podman's own words
        ("initialized", True),
        ("stopping", False),
        ("stopped", False),
        ("Running", True),
        ("some-new-state", True),  # unknown: never a reason to stop a task
        ("", False),
    ],
)
def test_a_task_is_held_while_a_container_of_it_runs_or_starts(state: str, holds: bool) -> None:
    assert holds_task(state) is holds
    assert set(HOLDS_TASK) >= {"created", "restarting", "running", "paused", "exited", "dead"}


def _c(task: str | None, state: str, handle: str | None = None) -> Owned:
    return Owned(f"id-{task}-{handle}-{state}", handle, task, state)


def _v(task: str | None, handle: str | None = None) -> Owned:
    return Owned(f"{task}-{handle}-data", handle, task)


@pytest.mark.parametrize(
    ("containers", "volumes", "expected"),
    [
        # A running task: the task, nothing else (its objects go with it).
        ([_c("t1", "running")], [_v("t1")], ([], [], ["t1"])),
        # Starting: created holds.
        ([_c("t1", "created")], [_v("t1")], ([], [], ["t1"])),
        # Exited, or killed by the engine: absent; the container and volume are leftovers.
        ([_c("t1", "exited")], [_v("t1")], (["task:t1"], ["task:t1"], [])),
        ([_c("t1", "dead")], [], (["task:t1"], [], [])),
        # Removed by hand, its volume still there: a volume alone holds nothing.
        ([], [_v("t1")], ([], ["task:t1"], [])),
        # One container of it still runs: held, and its ended one is no leftover.
        ([_c("t1", "exited"), _c("t1", "running")], [_v("t1")], ([], [], ["t1"])),
        # Handles are reported in every state, as they were, and never as leftovers.
        (
            [_c(None, "exited", "c-1"), _c("t2", "exited", "c-2")],
            [_v(None, "v-1"), _v("t2", "v-2")],
            (["c-1", "c-2"], ["v-1", "v-2"], []),
        ),
        # A reaper.handle in the reserved form is not a handle.
        ([_c(None, "running", "task:x")], [_v(None, "task:y")], ([], [], [])),
    ],
)
def test_what_the_docker_runtime_reports(
    containers: list[Owned], volumes: list[Owned], expected: tuple[list[str], ...]
) -> None:
    c, v, t = expected
    assert report_lists(containers, volumes) == {"containers": c, "volumes": v, "tasks": t}


def test_an_unlisted_kind_is_null_and_what_needs_it_too() -> None:
    running = [_c("t1", "running")]
    assert report_lists(None, [_v("t1")]) == {"containers": None, "volumes": None, "tasks": None}
    assert report_lists(running, None) == {"containers": [], "volumes": None, "tasks": ["t1"]}
