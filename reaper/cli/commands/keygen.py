"""``reaper keygen``: a new Ed25519 key for signing operator signals or an agent's
heartbeats (CONTRACT.md §5.2).

The private key goes to ``--out FILE`` (PKCS #8 PEM, mode 0600, never overwritten unless
``--force``); its public key, standard base64 of the 32 raw bytes (the form of
``REAPER_OPERATOR_KEYS`` and ``reaper.agent_keys``), is the only line on standard output, so
``reaper keygen --out op.pem >> operator_keys`` works. ``--out`` is required: a private key
printed to a terminal stays in its scrollback and in CI logs, and a default file would be
one that a second ``keygen`` (or another role's key) could silently collide with.
"""

from __future__ import annotations

from pathlib import Path

import typer

from reaper.cli.app import CliError, app, console, err, exit_now, fail


@app.command(short_help="Make an Ed25519 key for signing: private key to a file.")
def keygen(
    out: Path | None = typer.Option(
        None,
        "--out",
        metavar="FILE",
        help="Where the private key goes (PEM, mode 0600; parent directories are created). "
        "Required: the private key is never printed.",
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Replace FILE if it exists. The old key is gone for good: remove its public "
        "key from REAPER_OPERATOR_KEYS (or reaper.agent_keys).",
    ),
) -> None:
    """Make a new Ed25519 key: the private key is written to --out FILE (mode 0600), the
    public key printed on standard output, as REAPER_OPERATOR_KEYS lists it. Give FILE to
    the operator commands' --key-file (its public key in the controllers'
    REAPER_OPERATOR_KEYS), or to reaper agent --key-file (the public key may be enrolled in
    reaper.agent_keys beforehand)."""
    from reaper.cli.keys import write_new_key
    from reaper.core.signing import public_key_text

    try:
        if out is None:
            raise CliError(
                "--out FILE is needed: the private key is written to a file (mode 0600), "
                "never to the terminal; e.g. reaper keygen --out ~/.config/reaper/operator.pem",
                code=2,
            )
        key = write_new_key(out.expanduser(), replace=force)
    except CliError as exc:
        fail(exc)
    console.print(public_key_text(key), highlight=False, markup=False)
    err.print(
        f"wrote the private key to {out.expanduser()} (mode 0600); the public key above goes "
        "in REAPER_OPERATOR_KEYS (an operator's) or reaper.agent_keys (an agent's)",
        highlight=False,
        markup=False,
    )
    exit_now(0)
