"""What every workflow handler does with whatever arrives: any arity, any shape, any name.

Agents, operators' tools and controller replicas are upgraded at different times, and a
liveness never ends, so a handler must never fail its workflow task on what a sender adds. A
Python handler declared with one parameter raises ``TypeError`` when a second argument
arrives, and a raised exception fails the workflow task on every attempt: the workflow is
wedged for ever (the PostHog team hit this in a rollout: a new sender reaching old code).

So every signal and query handler, and every ``run``/``__init__``, of reaper's workflows takes
``*args``: it uses the first argument, parses it itself (a pydantic model's
``model_validate``, never a decode the SDK does before the handler), and what it cannot use is
logged and counted, never raised:

- arguments beyond the first: ignored (``reaper_signals_ignored_total{why="extra-arguments"}``),
  the first is handled as usual, so a newer agent's beat still counts;
- a signal name no handler knows: ignored (``why="unknown-signal"``), not buffered for ever;
- an internal signal (from reaper's own workflows) that does not parse: ignored
  (``why="malformed"``); malformed heartbeats and operator signals are rejected by the
  liveness itself and count in ``reaper_heartbeats_rejected_total`` (CONTRACT.md §5.4);
- a start input that does not parse: the workflow derives what it can from its id
  (``why="malformed-start"``).

A payload that is not JSON at all never reaches a handler: the SDK drops it with its own
warning ("Failed deserializing signal input"), and the workflow task completes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from workflows import hooks

T = TypeVar("T")

NAME_SHOWN = 64
"""At most this many characters of a sender's signal name go into a log line."""


def ignored(why: str, detail: str) -> None:
    """Log that input was ignored (``why``: ``extra-arguments``, ``unknown-signal``,
    ``malformed``, ``malformed-start``) and count it once, never again on replay."""
    kind = workflow.info().workflow_type
    workflow.logger.warning(
        "%s ignored input (%s): %s",
        kind,
        why,
        detail,
        extra={"action": "ignored", "reason": why, "workflow_type": kind},
    )
    hooks.count_ignored(kind, why)


def first(args: Sequence[Any], what: str) -> Any:
    """The one argument handler ``what`` uses: ``args[0]``, or ``None`` when none came.
    Arguments beyond the first are ignored, logged and counted."""
    if len(args) > 1:
        ignored("extra-arguments", f"{what}: {len(args) - 1} argument(s) beyond the first")
    return args[0] if args else None


def why_invalid(exc: ValidationError) -> str:
    """The first error of a pydantic validation, as ``where: message``."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "payload"
    return f"{where}: {err.get('msg')}"


def parse(validate: Callable[[Any], T], raw: Any, what: str, why: str = "malformed") -> T | None:
    """``validate(raw)`` (a pydantic ``model_validate`` or ``TypeAdapter.validate_python``),
    or ``None``, logged and counted under ``why``, if it raises a validation error. For
    internal signals and start inputs; the contract's own messages (beats, operator signals)
    are judged by the liveness itself, which rejects and counts them (§5.4)."""
    try:
        return validate(raw)
    except ValidationError as exc:
        ignored(why, f"{what}: {why_invalid(exc)}")
        return None


def start_input(validate: Callable[[Any], T], args: Sequence[Any]) -> T | None:
    """A workflow's start input: ``validate`` of its first argument, or ``None`` when it
    does not parse (logged and counted as ``malformed-start``)."""
    return parse(validate, first(args, "start input"), "start input", "malformed-start")


def unknown_signal(name: str, count: int) -> None:
    """A signal no handler of this workflow knows: ignored, logged, counted."""
    shown = name if len(name) <= NAME_SHOWN else name[:NAME_SHOWN] + "…"
    ignored("unknown-signal", f"signal {shown!r} with {count} argument(s)")


def worker_from_id(prefix: str) -> str | None:
    """The worker named by this workflow's id ``{prefix}{worker}``, or ``None``."""
    wid = workflow.info().workflow_id
    return wid[len(prefix) :] if wid.startswith(prefix) and len(wid) > len(prefix) else None
