"""Who may speak for a worker (CONTRACT.md §5.2), applied in the liveness's signal handlers.

:class:`Gate` checks a heartbeat's or an operator signal's Ed25519 signature
(``reaper.core.signing``) and applies ``reaper.core.policy.auth``. Everything it reads is in
workflow history or in the workflow's state: the mode and the operator keys come with the
run's start-up read (``begin_liveness``), the
pin with the liveness's state (and that read's pin at the start of a run). No secret is
involved: only public keys and signatures, so replaying an old history gives the same
verdicts whatever the controller's settings are today.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    # The Rust verifier imports its exception type when a signature is bad: it must find the
    # process's module, not a sandboxed copy (a failed import there aborts the process).
    import cryptography.exceptions  # noqa: F401

    from reaper.core import signing
    from reaper.core.liveness_state import LivenessState
    from reaper.core.policy import auth
    from reaper.core.policy.auth import AuthMode, Signer


def _verify(obj: dict[str, Any], key: str) -> bool:
    """``signing.verify`` run outside the sandbox's import machinery: the Rust verifier
    imports its exception type when a signature is bad, and an import the sandbox serves
    aborts the process. Verification is pure (no clock, no I/O), so this stays deterministic."""
    with workflow.unsafe.sandbox_unrestricted(), workflow.unsafe.imports_passed_through():
        return signing.verify(obj, key)


def _mode(live: LivenessState) -> AuthMode:
    return live.timings.agent_auth if live.timings is not None else AuthMode.off


def _utc(value: Any) -> datetime | None:
    """An ISO-8601 time with an offset, or ``None`` (a naive or unreadable one)."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return None
    return at if at.tzinfo is not None else None


class Gate:
    """Authenticates what arrives at one liveness, before any other rule looks at it.

    Args:
        live: the liveness's state (its timings, pin and used signatures are read and kept).
    """

    def __init__(self, live: LivenessState) -> None:
        self.live = live

    def use_pin(self, key: str | None) -> None:
        """Hold ``key``, the pin Postgres has for the worker, if authentication is on and this
        run has none yet (a first run, or one after a retirement)."""
        live = self.live
        if _mode(live) is AuthMode.off or live.agent_key is not None:
            return
        live.agent_key = key
        live.agent_key_recorded = key is not None

    def heartbeat(self, raw: dict[str, Any]) -> str | None:
        """Why this heartbeat may not speak for the worker, or ``None`` (accepted).

        An accepted first signed beat pins its key (``live.agent_key``; the loop writes it
        to ``reaper.agent_keys``). Called with the raw JSON object, before parsing rules on
        ``boot_id`` and ``seq`` (a rejected beat advances nothing).
        """
        live = self.live
        mode = _mode(live)
        if mode is AuthMode.off:
            return None
        carries = signing.KEY_FIELD in raw or signing.SIG_FIELD in raw
        key = raw.get(signing.KEY_FIELD)
        key = key if isinstance(key, str) else None
        valid = carries and key is not None and _verify(raw, key)
        verdict = auth.judge_beat(mode, live.agent_key, carries, key, valid)
        if verdict.accepted and verdict.pin is not None:
            live.agent_key, live.agent_key_recorded = verdict.pin, False
            workflow.logger.info("pinned the key of %s: %s", live.worker, verdict.pin)
        return verdict.reason

    def operator(self, signal: str, raw: Any) -> str | None:
        """Why this operator signal may not act, or ``None``; a signature that acts is
        remembered so that its replay is refused."""
        reason, remember = self.operator_refusal(signal, raw)
        if reason is None and remember is not None:
            sig, signed_at = remember
            self.live.used_signatures = auth.prune_used(self.live.used_signatures, workflow.now())
            self.live.used_signatures[sig] = signed_at
        return reason

    def operator_refusal(
        self, signal: str, raw: Any
    ) -> tuple[str | None, tuple[str, datetime] | None]:
        """Why this operator command may not act (``None``: it may), and the signature to
        remember if it acts (``(sig, signed_at)``). Reads only: an update's validator asks
        it (CONTRACT.md §6.3), and so does :meth:`operator`."""
        live = self.live
        mode = _mode(live)
        if mode is not AuthMode.required:
            return None, None
        if not isinstance(raw, dict):
            return f"{signal}: not a JSON object", None
        now = workflow.now()
        who: Signer | None = None
        if any(_verify(raw, k) for k in (live.timings.operator_keys if live.timings else ())):
            who = Signer.operator
        elif live.agent_key is not None and _verify(raw, live.agent_key):
            who = Signer.worker
        sig = raw.get(signing.SIG_FIELD)
        used = auth.prune_used(live.used_signatures, now)
        signed_at = _utc(raw.get(signing.SIGNED_AT_FIELD))
        reason = auth.judge_operator_signal(
            mode,
            signal,
            live.worker,
            raw.get("worker"),
            signed_at,
            now,
            who,
            isinstance(sig, str) and sig in used,
            raw.get(signing.SIGNAL_FIELD),
        )
        if reason is None and isinstance(sig, str) and signed_at is not None:
            return None, (sig, signed_at)
        return reason, None
