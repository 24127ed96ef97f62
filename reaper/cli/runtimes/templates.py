"""Per-service task templates of the ``docker`` runtime: how an assigned task becomes a
container.

``reaper agent --runtime docker --templates DIR`` reads ``DIR/<service>.toml`` when a task of
``<service>`` is assigned (read again each time: an edited template applies to the next task
started). The ``state`` query names tasks by id only, so a task's service is found from its
id: ``<service>`` itself or ``<service>-<anything>``, the form of reaper's replacements
(``<service>-<12 hex>``) and of ``reaper try-scheduler``'s tasks (``<service>-<n>``); the
longest matching service wins. The format is in docs/agent-runtimes.md.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from reaper.cli.runtimes.labels import RESERVED_PREFIX

SERVICE_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
"""Service names a template file can have (its name without ``.toml``)."""


class TemplateError(Exception):
    """A template that cannot be used: missing, unreadable or invalid; the message says why."""


class Limits(BaseModel):
    """Resource limits of the task's container (all optional)."""

    model_config = ConfigDict(extra="forbid")

    memory: str | int | None = None
    """Memory limit: bytes, or a string such as ``64m``, ``1g`` (the engine's ``Memory``)."""
    cpus: float | None = Field(default=None, gt=0)
    """CPUs, fractional (the engine's ``NanoCpus``)."""
    pids: int | None = Field(default=None, gt=0)
    """Most processes in the container (``PidsLimit``)."""
    nofile: int | None = Field(default=None, gt=0)
    """Open files, soft and hard (``ulimit nofile``)."""
    nproc: int | None = Field(default=None, gt=0)
    """Processes of the user, soft and hard (``ulimit nproc``)."""


class Template(BaseModel):
    """One service's template (``<service>.toml``). In the values of ``env``, in ``name``
    and in the keys of ``volumes``, ``{task}``, ``{service}`` and ``{worker}`` are replaced
    by the task's id, its service and the agent's worker."""

    model_config = ConfigDict(extra="forbid")

    image: str = Field(min_length=1)
    """The image, present on the host (the agent pulls nothing)."""
    command: list[str] | None = None
    """The command and its arguments; the image's own when omitted."""
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    """Labels added to the container; reaper's own (``reaper.*``) are set by the agent."""
    name: str | None = None
    """The container's name, e.g. ``"{task}"``; the engine picks one when omitted."""
    volumes: dict[str, str] = Field(default_factory=dict)
    """Named volumes created for the task (or reused, if the task has them): name -> path
    in the container, e.g. ``{"{task}-data" = "/data"}``."""
    runtime: str | None = None
    """The engine's OCI runtime (``runc``, ``crun``); the engine's default when omitted."""
    network: str | None = None
    """Network mode (``none``, ``bridge``, ``host``); the engine's default when omitted."""
    limits: Limits = Field(default_factory=Limits)

    @field_validator("labels")
    @classmethod
    def _not_reserved(cls, labels: dict[str, str]) -> dict[str, str]:
        for key in labels:
            if key.startswith(RESERVED_PREFIX):
                raise ValueError(f"label {key!r}: {RESERVED_PREFIX}* labels are set by the agent")
        return labels

    @field_validator("volumes")
    @classmethod
    def _absolute(cls, volumes: dict[str, str]) -> dict[str, str]:
        for path in volumes.values():
            if not path.startswith("/"):
                raise ValueError(f"volume path {path!r} must be absolute")
        return volumes


def fill(text: str, task: str, service: str, worker: str) -> str:
    """``text`` with ``{task}``, ``{service}`` and ``{worker}`` replaced (nothing else is
    interpreted: no format-string injection from a task id)."""
    return text.replace("{task}", task).replace("{service}", service).replace("{worker}", worker)


def service_of(task_id: str, services: list[str]) -> str | None:
    """The service of ``task_id`` among ``services``: the longest ``s`` with ``task_id == s``
    or ``task_id.startswith(s + "-")``; ``None`` if none matches."""
    matches = [s for s in services if task_id == s or task_id.startswith(s + "-")]
    return max(matches, key=len) if matches else None


class Templates:
    """The template directory (``None``: no templates, every task's template is missing)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = Path(directory) if directory is not None else None

    def services(self) -> list[str]:
        """Services that have a template file now."""
        if self.directory is None or not self.directory.is_dir():
            return []
        return sorted(p.stem for p in self.directory.glob("*.toml") if SERVICE_FILE.match(p.stem))

    def service_of(self, task_id: str) -> str | None:
        """The service whose template starts ``task_id`` (see :func:`service_of`)."""
        return service_of(task_id, self.services())

    def load(self, service: str) -> Template:
        """Read and check ``<service>.toml``.

        Raises:
            TemplateError: the file is missing, unreadable, not TOML or not a valid template.
        """
        if self.directory is None:
            raise TemplateError("no template directory (--templates)")
        path = self.directory / f"{service}.toml"
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise TemplateError(f"no template {path}") from None
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise TemplateError(f"{path}: {exc}") from None
        try:
            return Template.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "template"
            raise TemplateError(f"{path}: {where}: {first.get('msg')}") from None
