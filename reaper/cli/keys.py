"""Ed25519 private keys on disk for the command line (CONTRACT.md §5.2): ``reaper keygen``
writes one, ``reaper agent --key-file`` and the operator commands' ``--key-file`` read one.

The file format and the signing are :mod:`reaper.core.signing`'s (PKCS #8 PEM, created with
mode 0600). A key file readable by group or others is used, with a warning, as Compose and
Kubernetes mount secrets readable by default (0444, 0644); OpenSSH refuses such a file, and
an operator should not leave one so.
"""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from reaper.cli.app import CliError
from reaper.core.signing import (
    load_or_create_private_key,
    load_private_key,
    new_private_key,
    save_private_key,
)


def loose_mode(path: Path) -> str | None:
    """A warning when ``path`` may be read by group or others (its mode as octal), else
    ``None``."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None
    if mode & 0o077:
        return f"{path} may be read by others (mode {mode:04o}); `chmod 600 {path}`"
    return None


def read_key(path: Path, option: str, create: bool = False) -> Ed25519PrivateKey:
    """The Ed25519 private key in the PEM file at ``path``.

    Args:
        path: the key file.
        option: how the user gave it (``--key-file``), named in the error.
        create: make the file (a new key, mode 0600) if it does not exist (an agent's
            first start), instead of failing.

    Raises:
        CliError: exit status 2: the file is missing (without ``create``), cannot be read
            or written, or holds no Ed25519 private key (another algorithm's, an encrypted
            one, not PEM).
    """
    try:
        return load_or_create_private_key(path) if create else load_private_key(path)
    except FileNotFoundError as exc:
        if create:
            raise CliError(f"{option} {path}: {exc.strerror or exc}", code=2) from None
        raise CliError(
            f"{option} {path}: no such file (`reaper keygen --out {path}` makes one)", code=2
        ) from None
    except OSError as exc:
        raise CliError(f"{option} {path}: {exc.strerror or exc}", code=2) from None
    except (ValueError, TypeError, UnsupportedAlgorithm):  # not PEM, encrypted, not Ed25519
        raise CliError(
            f"{option} {path}: not an unencrypted Ed25519 private key in PEM "
            "(`reaper keygen` makes one)",
            code=2,
        ) from None


def write_new_key(path: Path, replace: bool) -> Ed25519PrivateKey:
    """A new Ed25519 private key, written to ``path`` with mode 0600 (parents created).

    Args:
        path: where the private key goes.
        replace: replace an existing file at ``path`` (atomically: the key is written to a
            new file beside it, then renamed over it); otherwise an existing file is an error.

    Raises:
        CliError: exit status 1: ``path`` exists and ``replace`` is false, is a directory,
            or cannot be written.
    """
    key = new_private_key()
    if path.is_dir():
        raise CliError(f"{path} is a directory: give the key's file name")
    try:
        if not replace:
            save_private_key(key, path)
            return key
        fresh = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.new")
        save_private_key(key, fresh)
        try:
            os.replace(fresh, path)
        except OSError:
            fresh.unlink(missing_ok=True)
            raise
    except FileExistsError:
        raise CliError(
            f"{path} exists: not overwritten (a key is an identity: give another --out, or "
            "--force to replace it)"
        ) from None
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
    return key
