"""One logging set-up for the controller (``worker.py``) and the ``reaper`` command.

On a terminal, lines are readable (rich); otherwise (a file, a pipe, a log collector) each
record is one JSON object per line. Either way a record carries the fields below when the
caller gave them as ``extra=`` (``worker``, ``handle``, ``reason`` ...), and the Temporal
workflow id of the workflow or activity that logged it (the SDK puts it in the record's
``temporal_workflow`` or ``temporal_activity`` extra).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

FIELDS = ("worker", "kind", "handle", "action", "reason", "actor", "workflow_id")
"""``extra=`` fields copied into every line, in this order, when present."""


def workflow_id_of(record: logging.LogRecord) -> str | None:
    """The workflow id a record belongs to: an explicit ``workflow_id`` extra, else the one
    the Temporal SDK attached (workflow logger, activity logger); ``None`` if neither."""
    explicit = getattr(record, "workflow_id", None)
    if explicit:
        return str(explicit)
    for attr in ("temporal_workflow", "temporal_activity"):
        details = getattr(record, attr, None)
        if isinstance(details, dict) and details.get("workflow_id"):
            return str(details["workflow_id"])
    return None


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The :data:`FIELDS` a record carries (``None`` values left out)."""
    out: dict[str, Any] = {}
    for name in FIELDS:
        value = workflow_id_of(record) if name == "workflow_id" else getattr(record, name, None)
        if value is not None:
            out[name] = value
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``msg``,
    then the :data:`FIELDS` present, then ``exc`` (the traceback) if there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **fields_of(record),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class ReadableFormatter(logging.Formatter):
    """``logger: message  key=value ...`` for a terminal (time and level come from rich)."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{record.name}: {record.getMessage()}"
        extra = fields_of(record)
        if extra:
            text += "  " + " ".join(f"{k}={v}" for k, v in extra.items())
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def setup_logging(
    level: int = logging.INFO, *, stream: TextIO | None = None, json_lines: bool | None = None
) -> logging.Handler:
    """Route every logger to ``stream`` (standard error by default), replacing earlier
    handlers of the root logger.

    Args:
        level: the root logger's level (``logging.INFO``, ``logging.DEBUG``).
        stream: where lines go; standard error if ``None``.
        json_lines: JSON lines if True, readable lines if False; ``None`` decides by
            whether ``stream`` is a terminal.

    Returns:
        The handler installed (tests read its formatter).
    """
    out = stream if stream is not None else sys.stderr
    if json_lines is None:
        json_lines = not (hasattr(out, "isatty") and out.isatty())
    handler: logging.Handler
    if json_lines:
        handler = logging.StreamHandler(out)
        handler.setFormatter(JsonFormatter())
    else:
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(
            console=Console(file=out, soft_wrap=True),
            show_path=False,
            markup=False,
            rich_tracebacks=False,
        )
        handler.setFormatter(ReadableFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    _quiet_temporal_messages()
    return handler


def _quiet_temporal_messages() -> None:
    """The Temporal SDK appends its workflow and activity details to each message; they are
    fields here already (``workflow_id``), so keep messages short. A no-op unless the SDK
    is imported (the CLI's light commands never import it)."""
    workflow = sys.modules.get("temporalio.workflow")
    if workflow is not None:
        workflow.logger.workflow_info_on_message = False
    activity = sys.modules.get("temporalio.activity")
    if activity is not None:
        activity.logger.activity_info_on_message = False
