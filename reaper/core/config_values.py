"""Values of the controller's settings as operators write them: durations (``30s``, ``5m``,
``1h30m``) and lists of Ed25519 public keys; parsed and checked here, used by
``reaper.core.config`` and the command line."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator

from reaper.core.signing import is_public_key

_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: Any) -> float:
    """Parse a duration into seconds.

    Args:
        value: a number of seconds (int, float or numeric string), a ``timedelta``, or a string
            of one or more ``<number><unit>`` parts with units ``ms``, ``s``, ``m``, ``h``, ``d``
            (``"30s"``, ``"5m"``, ``"1h30m"``).

    Returns:
        The duration in seconds, a float >= 0.

    Raises:
        ValueError: the value is negative, empty or not in one of the forms above.
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string such as 30s, 5m, 1h")
    elif isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for match in _PART.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
                pos = match.end()
            if pos != len(text) or not text:
                raise ValueError(
                    f"{value!r} is not a duration: use seconds or a string such as 30s, 5m, 1h"
                ) from None
    else:
        raise ValueError("a duration is a number of seconds or a string such as 30s, 5m, 1h")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


Seconds = Annotated[float, BeforeValidator(parse_duration)]


def parse_keys(value: Any) -> tuple[str, ...]:
    """Ed25519 public keys from a string separated by commas or whitespace, or a sequence.

    Raises:
        ValueError: an entry is not standard base64 of 32 bytes.
    """
    items = re.split(r"[,\s]+", value) if isinstance(value, str) else list(value or ())
    keys = tuple(k.strip() for k in items if isinstance(k, str) and k.strip())
    for key in keys:
        if not is_public_key(key):
            raise ValueError(
                f"{key[:16]!r}... is not an Ed25519 public key (standard base64 of 32 bytes; "
                "`reaper keygen --out FILE` makes a key and prints it)"
            )
    return keys


CORES_PER_CONTROLLER = 2
"""Host cores per controller process of ``reaper run`` (:func:`controllers_for`)."""


def controllers_for(cpus: int | None) -> int:
    """The default of ``REAPER_CONTROLLERS``: how many controller processes ``reaper run``
    starts on a host with ``cpus`` cores (``os.cpu_count()``; ``None`` when unknown counts
    as one): one per :data:`CORES_PER_CONTROLLER` cores, at least one.

    Why: a controller is one Python process, its workflow code on one core at a time (the
    GIL), and on the embedded stack the Temporal dev server and Postgres share the host; on
    2 busy cores a second process ran fewer workflow tasks than one (docs/capacity.md,
    "Controller processes per host").
    """
    return max(1, (cpus or 1) // CORES_PER_CONTROLLER)


def process_ports(metrics_port: int, sdk_metrics_port: int, count: int) -> list[tuple[int, int]]:
    """Each of ``count`` controller processes' ``(metrics port, SDK metrics port)`` on one
    host: the first has the ports set, each further one the next pair (``+2``, ``+4`` ...:
    9464/9465, 9466/9467 ... at the defaults); a port set to ``0`` (off) stays ``0``.

    Raises:
        ValueError: two processes would share a port, or one would pass 65535.
    """
    out = [
        (metrics_port and metrics_port + 2 * i, sdk_metrics_port and sdk_metrics_port + 2 * i)
        for i in range(count)
    ]
    used = [p for pair in out for p in pair if p]
    if len(set(used)) < len(used):
        raise ValueError(
            f"{count} controller processes take the metrics ports {metrics_port} and "
            f"{sdk_metrics_port} and the next pairs (+2 each), which collide: set the two "
            "ports an odd distance apart (9464 and 9465 by default)"
        )
    if used and max(used) > 65535:
        raise ValueError(f"{count} controller processes' metrics ports pass 65535")
    return out
