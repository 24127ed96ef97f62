"""Sealed reports: the collector acts only on reports its own liveness forwarded (§5.2).

Temporal does not tell a workflow who sent a signal, so anyone with signal rights on
``gc-{worker}`` could hand the collector a report that marks, and later destroys, that
worker's rows. The liveness therefore seals each report it forwards with an HMAC-SHA256
keyed by the controller's secret, and the collector's activities, which do the marking and
destroying, refuse a report whose seal does not match.

The secret is 32 random bytes that Postgres generates once (``reaper.controller_secret``,
migration 006): every replica shares it, and it is never in workflow history (only seals
are, which reveal nothing of it). Workflow code reads it from this process (installed by the
controller at start, before its worker polls): it only shapes the payload of a signal and
never a decision of the workflow, so a replay, even without the secret, takes the same path.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime
from typing import Protocol

import asyncpg

from reaper.core.protocol import report_digest

_secret: bytes | None = None


async def load_secret(pool: asyncpg.Pool) -> bytes:
    """The controller's secret from ``reaper.controller_secret``; installed in this process.

    Raises:
        RuntimeError: the table is empty (migrations not applied).
    """
    secret = await pool.fetchval("SELECT secret FROM reaper.controller_secret WHERE id = 1")
    if secret is None:
        raise RuntimeError("reaper.controller_secret is empty: apply the migrations first")
    install(bytes(secret))
    return bytes(secret)


def install(secret: bytes) -> None:
    """Use ``secret`` for the seals this process makes and checks."""
    global _secret
    _secret = secret


class Sealable(Protocol):
    """The deciding fields of a forwarded report (``Report`` and ``SealedReport`` have them)."""

    digest: str
    taken_at: datetime
    boot_id: str
    staged_id: str | None
    restart_all: bool
    also_seen: list[str]


def seal(worker: str, kind: str, r: Sealable) -> str:
    """The seal of one forwarded report of ``worker``'s ``kind``: hex HMAC-SHA256 of its
    deciding fields, or ``""`` when no secret is installed (such a report is refused)."""
    if _secret is None:
        return ""
    body = json.dumps(
        [
            worker,
            kind,
            r.digest,
            r.taken_at.isoformat(),
            r.boot_id,
            r.staged_id,
            r.restart_all,
            report_digest(r.also_seen) if r.also_seen else "",
        ],
        separators=(",", ":"),
    ).encode()
    return hmac.new(_secret, body, hashlib.sha256).hexdigest()


def is_sealed(
    seal_value: str, worker: str, kind: str, r: Sealable, handles: list[str] | None
) -> bool:
    """True when ``seal_value`` is the seal of report ``r`` and, for an inline report,
    ``handles`` are the handles its digest names."""
    if _secret is None or not seal_value:
        return False
    if r.staged_id is None and handles is not None and report_digest(handles) != r.digest:
        return False
    return hmac.compare_digest(seal(worker, kind, r), seal_value)
