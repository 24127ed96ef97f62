"""The log formatters of :mod:`reaper.logs`: JSON lines carry the fields given as ``extra=``
and the workflow id the Temporal SDK attaches; readable lines carry them as key=value."""

from __future__ import annotations

import io
import json
import logging

from reaper.logs import JsonFormatter, ReadableFormatter, setup_logging


def _record(msg: str = "destroyed container c-1: missing", **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("reaper.events", logging.INFO, __file__, 1, msg, None, None)
    for k, v in extra.items():
        setattr(record, k, v)
    return record


def test_json_line_has_the_fields_given_and_the_activity_workflow_id() -> None:
    record = _record(
        worker="w1",
        kind="container",
        handle="c-1",
        action="destroyed",
        reason="missing",
        temporal_activity={"workflow_id": "gc-w1", "activity_type": "destroy_missing"},
    )
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "destroyed container c-1: missing"
    assert (line["level"], line["logger"]) == ("info", "reaper.events")
    assert line["ts"].endswith("+00:00")
    for key, value in (
        ("worker", "w1"),
        ("kind", "container"),
        ("handle", "c-1"),
        ("action", "destroyed"),
        ("reason", "missing"),
        ("workflow_id", "gc-w1"),
    ):
        assert line[key] == value
    assert "actor" not in line  # fields not given are left out, not null


def test_json_line_takes_the_workflow_id_from_the_workflow_logger() -> None:
    record = _record(
        "rejected input for w1: heartbeat: seq: bad",
        worker="w1",
        action="rejected",
        reason="heartbeat: seq: bad",
        temporal_workflow={"workflow_id": "liveness-w1", "workflow_type": "WorkerLiveness"},
    )
    line = json.loads(JsonFormatter().format(record))
    assert line["workflow_id"] == "liveness-w1" and line["action"] == "rejected"


def test_json_line_keeps_a_traceback_in_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    text = JsonFormatter().format(record)
    assert "\n" not in text and "ValueError: boom" in json.loads(text)["exc"]


def test_readable_line_appends_the_fields() -> None:
    text = ReadableFormatter().format(_record(worker="w1", handle="c-1", workflow_id="gc-w1"))
    assert text.startswith("reaper.events: destroyed container c-1")
    assert text.endswith("worker=w1 handle=c-1 workflow_id=gc-w1")


def test_setup_chooses_json_off_a_terminal() -> None:
    out = io.StringIO()  # not a terminal
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        setup_logging(stream=out)
        logging.getLogger("reaper.test").info("hello", extra={"worker": "w9"})
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    line = json.loads(out.getvalue())
    assert line["msg"] == "hello" and line["worker"] == "w9"
