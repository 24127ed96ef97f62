"""Who may speak for a worker (CONTRACT.md §5.2): the rules for heartbeats and operator signals.

Pure functions of what arrived and what is pinned; the signature check itself is
``reaper.core.signing.verify``, done by the caller, whose result comes in as a flag. The
liveness workflow applies these before the ``boot_id``/``seq`` rules, so a rejected message
never advances anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum


class AuthMode(str, Enum):
    """``REAPER_AGENT_AUTH``: how heartbeats and operator signals are authenticated."""

    off = "off"
    """v1: ``agent_key`` and ``sig`` are ignored."""
    pin = "pin"
    """Default: a worker's first signed beat pins its key; unsigned workers stay v1."""
    required = "required"
    """Unsigned beats are rejected; operator signals must be signed."""


SIGNAL_WINDOW_S = 300.0
"""A signed operator signal is accepted within 5 minutes of the controller's clock (§5.2)."""

WORKER_MAY_SIGN = frozenset({"retire", "drain"})
"""Operator signals a worker may sign with its own pinned key (§5.2): it may leave, or ask
for no new work, but never reap itself or undrain."""


@dataclass(frozen=True)
class BeatAuth:
    """Verdict on one heartbeat: ``accepted``, the key to ``pin`` (newly), or why not."""

    accepted: bool
    pin: str | None = None
    reason: str | None = None


def judge_beat(
    mode: AuthMode,
    pinned: str | None,
    carries_auth: bool,
    agent_key: str | None,
    valid: bool,
) -> BeatAuth:
    """May this heartbeat speak for its worker? (CONTRACT.md §5.2)

    Args:
        mode: ``REAPER_AGENT_AUTH``.
        pinned: the worker's pinned public key (learned or enrolled), if any.
        carries_auth: the beat has an ``agent_key`` or a ``sig`` member (even ``null``).
        agent_key: the beat's ``agent_key`` if it is a string, else ``None``.
        valid: ``sig`` is a valid signature of the beat by ``agent_key``.

    A signed beat is judged on its signature even before any pin exists; a worker whose key
    is pinned is heard only with that key; ``required`` hears no unsigned beat. The first
    accepted signed beat of an unpinned worker pins its key (``pin`` in the verdict).
    """
    if mode is AuthMode.off:
        return BeatAuth(True)
    if carries_auth:
        if agent_key is None or not valid:
            return BeatAuth(False, reason="bad signature: agent_key and a valid sig are required")
        if pinned is not None and agent_key != pinned:
            return BeatAuth(False, reason="signed by another key than the worker's pinned key")
        return BeatAuth(True, pin=agent_key if pinned is None else None)
    if pinned is not None:
        return BeatAuth(False, reason="unsigned beat for a worker whose key is pinned")
    if mode is AuthMode.required:
        return BeatAuth(False, reason="unsigned beat: REAPER_AGENT_AUTH=required")
    return BeatAuth(True)


class Signer(str, Enum):
    """Whose key signed an operator signal."""

    operator = "operator"
    worker = "worker"


def judge_operator_signal(
    mode: AuthMode,
    signal: str,
    target: str,
    worker: object,
    signed_at: datetime | None,
    now: datetime,
    signer: Signer | None,
    replayed: bool,
    named: object = None,
) -> str | None:
    """Why an operator signal is rejected, or ``None`` if it may act (CONTRACT.md §5.2).

    Args:
        mode: ``REAPER_AGENT_AUTH``; only ``required`` asks for signatures.
        signal: ``force_reap``, ``drain``, ``undrain`` or ``retire``.
        target: the worker whose liveness received it.
        worker: the signal's ``worker`` member (``None`` when absent).
        signed_at: its ``signed_at`` (UTC), ``None`` when absent or unreadable.
        now: the controller's clock (UTC).
        signer: whose key made its valid signature, ``None`` for none.
        replayed: the same signature acted before.
        named: the signal's ``signal`` member, if any: the signal it was signed for.
    """
    if mode is not AuthMode.required:
        return None
    if signer is None:
        return f"{signal}: not signed by an operator key (REAPER_AGENT_AUTH=required)"
    if named is not None and named != signal:
        return f"{signal}: signed for signal {named!r}"
    if worker != target:
        return f"{signal}: signed for worker {worker!r}, not {target!r}"
    if signed_at is None or abs(now - signed_at) > timedelta(seconds=SIGNAL_WINDOW_S):
        return f"{signal}: signed_at is more than {SIGNAL_WINDOW_S:g}s from the controller's clock"
    if signer is Signer.worker and signal not in WORKER_MAY_SIGN:
        return f"{signal}: a worker's own key may only sign {sorted(WORKER_MAY_SIGN)}"
    if replayed:
        return f"{signal}: this signature acted already (replay)"
    return None


def prune_used(used: dict[str, datetime], now: datetime) -> dict[str, datetime]:
    """Signatures that acted, keeping only those that could still arrive in the window.

    ``used`` maps a signature to its ``signed_at``; one signed more than the window before
    ``now`` is rejected as stale anyway, so it need not be remembered.
    """
    horizon = now - timedelta(seconds=SIGNAL_WINDOW_S)
    return {sig: at for sig, at in used.items() if at >= horizon}
