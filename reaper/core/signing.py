"""Ed25519 signatures on heartbeats and operator signals (CONTRACT.md §5.2).

The wire format: ``agent_key`` is the signer's public key, standard base64 of its 32 raw
bytes; ``sig`` is standard base64 of the Ed25519 signature of the object without its ``sig``
member, serialised as canonical JSON (RFC 8785; for reaper's payloads, which hold strings,
integers, lists, objects and ``null`` only, that is ``json.dumps(obj, sort_keys=True,
separators=(",", ":"), ensure_ascii=False)`` encoded as UTF-8).

Private keys live in PEM files (PKCS #8, readable by ``openssl pkey``), created with mode
0600. Verification is a pure function of its inputs (no clock, no I/O), so the liveness
workflow can run it in a signal handler and replay it.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

KEY_FIELD = "agent_key"
SIG_FIELD = "sig"
SIGNED_AT_FIELD = "signed_at"
SIGNAL_FIELD = "signal"
"""Optional member of a signed operator signal naming the signal it is for (reaper's CLI
always sets it; CONTRACT.md §5.2 is silent, so a signature without it is accepted too)."""
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64


def canonical_json(obj: dict[str, Any]) -> bytes:
    """``obj`` as RFC 8785 canonical JSON bytes (sorted keys, no spaces, UTF-8).

    Raises:
        TypeError: ``obj`` holds something JSON cannot carry.
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def signed_bytes(obj: dict[str, Any]) -> bytes:
    """The bytes a signature covers: ``obj`` without its ``sig`` member, canonical JSON."""
    return canonical_json({k: v for k, v in obj.items() if k != SIG_FIELD})


def _b64(text: Any, size: int) -> bytes | None:
    """Strict, canonical standard base64 of exactly ``size`` bytes, or ``None``.

    Canonical: the text is what ``b64encode`` gives for those bytes. A decoder ignores the
    unused low bits of the last character, so without this check one signature has several
    spellings (``...Ag==`` and ``...Ah==``), and a spelling not seen before would pass the
    replay guard of a signed operator signal, which remembers signatures by their text
    (found by tests/workflows/test_front_door.py, 2026-12-03: a mutated ``drain`` acted)."""
    if not isinstance(text, str) or len(text) > 2 * size + 8:
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) != size or base64.b64encode(raw).decode() != text:
        return None
    return raw


def is_public_key(text: Any) -> bool:
    """True when ``text`` is standard base64 of 32 bytes (an Ed25519 public key's form)."""
    return _b64(text, PUBLIC_KEY_BYTES) is not None


@lru_cache(maxsize=65_536)
def _public_key(text: str) -> Ed25519PublicKey | None:
    raw = _b64(text, PUBLIC_KEY_BYTES)
    if raw is None:
        return None
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return None


def verify(obj: dict[str, Any], public_key: Any) -> bool:
    """True when ``obj["sig"]`` is a valid signature of ``obj`` by ``public_key``.

    Args:
        obj: the decoded JSON object as received (all members but ``sig`` are covered).
        public_key: standard base64 of a 32-byte Ed25519 public key.

    Never raises: a malformed key, a missing or malformed signature, or an object that is
    not JSON all give ``False``.
    """
    key = _public_key(public_key) if isinstance(public_key, str) else None
    sig = _b64(obj.get(SIG_FIELD), SIGNATURE_BYTES) if isinstance(obj, dict) else None
    if key is None or sig is None:
        return False
    try:
        key.verify(sig, signed_bytes(obj))
    except (InvalidSignature, TypeError, ValueError):
        return False
    return True


def signer(obj: dict[str, Any], keys: tuple[str, ...] | list[str]) -> str | None:
    """The first of ``keys`` whose signature ``obj`` carries, or ``None``."""
    for key in keys:
        if verify(obj, key):
            return key
    return None


# ---- keys and signing (agents and operators) ------------------------------------------


def new_private_key() -> Ed25519PrivateKey:
    """A fresh Ed25519 private key."""
    return Ed25519PrivateKey.generate()


def public_key_text(key: Ed25519PrivateKey) -> str:
    """The public half of ``key`` in the wire form: standard base64 of 32 raw bytes."""
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def save_private_key(key: Ed25519PrivateKey, path: Path) -> None:
    """Write ``key`` to ``path`` as unencrypted PKCS #8 PEM, mode 0600, creating parents.

    Raises:
        FileExistsError: ``path`` exists (a key is never overwritten).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in the PEM file at ``path``.

    Raises:
        OSError: the file cannot be read.
        ValueError: the file holds no Ed25519 private key.
    """
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} holds no Ed25519 private key")
    return key


def load_or_create_private_key(path: Path) -> Ed25519PrivateKey:
    """The key at ``path``, created first if the file does not exist (an agent's first start).

    Raises:
        OSError, ValueError: as :func:`load_private_key`.
    """
    if not path.exists():
        try:
            save_private_key(new_private_key(), path)
        except FileExistsError:
            pass  # another process created it first: use theirs
    return load_private_key(path)


def sign(obj: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """``obj`` with ``sig`` set to the signature of the rest of it (a new dict)."""
    body = {k: v for k, v in obj.items() if k != SIG_FIELD}
    sig = key.sign(canonical_json(body))
    return {**body, SIG_FIELD: base64.b64encode(sig).decode()}


def sign_heartbeat(beat: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """A heartbeat signed by an agent: ``agent_key`` set to ``key``'s public half, then signed."""
    return sign({**beat, KEY_FIELD: public_key_text(key)}, key)


def sign_operator_signal(
    payload: dict[str, Any],
    worker: str,
    key: Ed25519PrivateKey,
    now: datetime | None = None,
    signal: str | None = None,
) -> dict[str, Any]:
    """An operator signal (``force_reap``, ``drain``, ``undrain``, ``retire``) signed for
    ``worker`` at ``now`` (UTC, millisecond precision; default the current time), as §5.2
    ``required`` mode wants. With ``signal``, the object also names the signal it is for
    (member ``signal``), so the signature cannot be replayed as another signal."""
    at = (now or datetime.now(UTC)).astimezone(UTC).isoformat(timespec="milliseconds")
    body = {**payload, "worker": worker, SIGNED_AT_FIELD: at.replace("+00:00", "Z")}
    if signal is not None:
        body[SIGNAL_FIELD] = signal
    return sign(body, key)
