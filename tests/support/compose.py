"""Reading docker-compose.yml and the contract's variables for the static stack checks.

No Docker engine runs on the project's machines (docs/platform-notes.md): tests/e2e/test_compose*.py
read the files instead. Values are seen as Compose would see them with an empty shell
environment (``${VAR:-default}`` gives ``default``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import ROOT

COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
CONTRACT = ROOT / "docs" / "CONTRACT.md"

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err} (Compose interpolation).
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")
# A row of a contract variable table: | `REAPER_X` | default | meaning |
_VARIABLE_ROW = re.compile(r"^\| `(REAPER_[A-Z0-9_]+)` \| ([^|]*) \|", re.MULTILINE)


def interpolate(value: str) -> str:
    """``value`` as Compose would see it with an empty shell environment: defaults applied.

    Raises:
        AssertionError: a variable without a default (``docker compose up`` would need it).
    """

    def substitute(match: re.Match[str]) -> str:
        op, arg = match.group(2), match.group(3)
        if op in (":-", "-"):
            return arg
        raise AssertionError(f"{match.group(0)} has no default: `docker compose up` needs it set")

    return _INTERPOLATION.sub(substitute, value.replace("$$", "\0")).replace("\0", "$")


def load_compose() -> dict[str, Any]:
    """docker-compose.yml parsed (YAML anchors and ``<<`` merges resolved)."""
    with COMPOSE.open(encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    assert isinstance(data, dict)
    return data


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as a dict, whichever of the two Compose forms it uses."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def healthcheck_text(service: dict[str, Any]) -> str:
    """A service's health check test as one string."""
    test = service["healthcheck"]["test"]
    return test if isinstance(test, str) else " ".join(test)


def controllers(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The services built from this repository's Dockerfile (the controller replicas)."""
    return {name: svc for name, svc in services.items() if "build" in svc}


def service_secrets(service: dict[str, Any]) -> set[str]:
    """Names of the secrets granted to a service (short or long form)."""
    return {s if isinstance(s, str) else s["source"] for s in service.get("secrets") or []}


def contract_variables() -> dict[str, str | None]:
    """Every ``REAPER_*`` variable of the contract's tables (CONTRACT.md §1 and §5), with its
    documented default (``None`` for a default that is not a value: the embedded stack, empty).
    """
    found: dict[str, str | None] = {}
    for name, default in _VARIABLE_ROW.findall(CONTRACT.read_text(encoding="utf-8")):
        value = re.fullmatch(r"`([^`]*)`", default.strip())
        found[name] = value.group(1) if value else None
    return found


def repo_path(source: str) -> Path:
    """A path of the compose file (relative to it, defaults interpolated) in the repository."""
    return (COMPOSE.parent / interpolate(source)).resolve()
