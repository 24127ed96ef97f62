"""The public contract (CONTRACT.md §2): names, ids and payloads that agents and operators use.

This module is all an agent needs to speak to reaper; it imports nothing else of reaper and
nothing of Temporal or Postgres. Every model crosses Temporal as JSON through
``pydantic_data_converter``.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import Enum
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StringConstraints,
    model_validator,
)

from reaper.core import kinds
from reaper.core.config_values import Seconds

LIVENESS_WORKFLOW = "WorkerLiveness"
"""Workflow type of a worker's liveness, started by signal-with-start with input
``{"worker": "<name>"}``."""
HEARTBEAT_SIGNAL = "heartbeat"
FORCE_REAP_SIGNAL = "force_reap"
DRAIN_SIGNAL = "drain"
UNDRAIN_SIGNAL = "undrain"
RETIRE_SIGNAL = "retire"
STATE_QUERY = "state"
DEFAULT_TASK_QUEUE = "reaper"
DEFAULT_ADDRESS = "127.0.0.1:7233"
"""The embedded dev server's frontend, the default of ``REAPER_TEMPORAL_ADDRESS``."""

SEARCH_ATTRIBUTES: dict[str, str] = {
    "ReaperWorker": "keyword",
    "ReaperState": "keyword",
    "ReaperMissing": "int",
}
"""Custom search attributes on every liveness workflow, name -> type (CONTRACT.md §2)."""


LIVENESS_PREFIX = "liveness-"
"""Workflow ids of livenesses are this prefix and the worker's name (CONTRACT.md §2)."""


def liveness_id(worker: str) -> str:
    """Workflow id of a worker's liveness: ``liveness-{worker}`` (CONTRACT.md §2)."""
    return f"{LIVENESS_PREFIX}{worker}"


FLEET_ID = "reaper-fleet"
"""Workflow id of the fleet monitor of the default task queue."""


def fleet_monitor_id(task_queue: str) -> str:
    """Workflow id of the fleet monitor of the controllers on ``task_queue``: ``reaper-fleet``
    for the default queue ``reaper``, ``reaper-fleet-{task_queue}`` for any other."""
    return FLEET_ID if task_queue == "reaper" else f"{FLEET_ID}-{task_queue}"


WORKER_NAME = re.compile(r"^[A-Za-z0-9._:-]{1,253}$")
"""A worker name: 1-253 characters of ``[A-Za-z0-9._:-]`` (CONTRACT.md section 2)."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

KINDS: tuple[str, ...] = kinds.REPORTS
"""The kinds of handle a report carries (``reaper.core.kinds``, declared once there)."""

Kind = Literal["containers", "volumes", "tasks"]
"""A report kind, for the payload's digests (a test holds it to :data:`KINDS`)."""


def _check_worker(value: str) -> str:
    if not WORKER_NAME.match(value):
        raise ValueError("worker must be 1-253 characters of [A-Za-z0-9._:-]")
    return value


def _check_boot_id(value: str) -> str:
    if not 1 <= len(value) <= 128 or _CONTROL.search(value):
        raise ValueError("boot_id must be 1-128 characters without control characters")
    return value


def _check_text(value: str) -> str:
    if "\x00" in value:
        raise ValueError("text may not contain NUL (U+0000): Postgres text cannot hold it")
    return value


MAX_SEQ = 2**63 - 1
"""Largest ``seq`` taken: CONTRACT.md §2 asks for an integer >= 0, and ``workers.last_seq``
is a Postgres ``bigint``; a larger one is malformed input (rejected, nothing changes), not
a value that would fail every write of the worker's row (breaker finding, 2026-12-02)."""

WorkerName = Annotated[str, AfterValidator(_check_worker)]
Text = Annotated[str, AfterValidator(_check_text)]
"""Free text that is stored in Postgres (a reason, an actor): anything but NUL."""
Handle = Annotated[
    str, StringConstraints(min_length=1, max_length=512, pattern=r"^[^\x00-\x1f\x7f-\x9f]*$")
]
"""A handle: 1-512 characters, no control characters (C0, DEL, C1; CONTRACT.md §2). Checked
by pydantic-core's own length and pattern checks, not by a Python function per handle: a
100,000-handle report is 100,000 of them, validated in the liveness's workflow task
(BENCHMARKS.md, metric 3b)."""
BootId = Annotated[str, AfterValidator(_check_boot_id)]


class WorkerState(str, Enum):
    """A worker's liveness state; names follow Kubernetes' node lifecycle (Ready/Unknown)."""

    running = "running"
    stalled = "stalled"
    lost = "lost"
    retired = "retired"
    """Out of the fleet for good (CONTRACT.md §5.1): neither healthy nor unhealthy."""


_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _check_digest(value: str) -> str:
    if not _HEX64.match(value):
        raise ValueError(
            "a digest is 64 lowercase hex characters (sha256, reaper.core.protocol.report_digest)"
        )
    return value


Digest = Annotated[str, AfterValidator(_check_digest)]

MAX_CHUNKS = 10_000
"""Most chunks one report may have (a 200,000-handle report needs about 50 of 128 KiB)."""


class ReportChunk(BaseModel):
    """Part ``index`` of ``count`` of one complete report (protocol extension, CONTRACT v1.1).

    A report too large for one payload is sent as chunks, each in its own heartbeat (with its
    own ``seq``). It counts as a complete report, taken when its first chunk arrived, only
    once every chunk has arrived and the union's digest equals ``digest``; an incomplete
    report (a chunk lost, the agent dead mid-report) never marks anything.
    """

    model_config = ConfigDict(extra="ignore")

    kind: Kind
    report_id: BootId
    index: StrictInt = Field(ge=0)
    count: StrictInt = Field(ge=1, le=MAX_CHUNKS)
    digest: Digest
    handles: list[Handle]

    @model_validator(mode="after")
    def _index_in_range(self) -> ReportChunk:
        if self.index >= self.count:
            raise ValueError("chunk index must be less than count")
        return self


class Heartbeat(BaseModel):
    """Signal ``heartbeat`` (CONTRACT.md section 2).

    ``containers``/``volumes``/``tasks``: the COMPLETE list of handles of that kind the worker
    holds now; ``None`` means "not reported in this beat" (liveness only), ``[]`` "none".
    Unknown fields are ignored so that later protocol versions stay readable.
    """

    model_config = ConfigDict(extra="ignore", strict=False)

    worker: WorkerName
    boot_id: BootId
    seq: StrictInt = Field(ge=0, le=MAX_SEQ)
    sent_at: datetime | None = None
    containers: list[Handle] | None = None
    volumes: list[Handle] | None = None
    tasks: list[Handle] | None = None
    digests: dict[Kind, Digest] | None = None
    """Extension: "my complete list of this kind is unchanged and has this digest". Counts as
    a complete report when it equals the digest of the last complete report the controller
    holds (``state`` query ``report_digests``); otherwise it is liveness only."""
    chunk: ReportChunk | None = None
    """Extension: one chunk of a large complete report."""

    def report(self, kind: str) -> list[str] | None:
        """The complete list reported for ``kind`` (one of :data:`KINDS`), or ``None``."""
        return getattr(self, kind)

    @property
    def is_complete_report(self) -> bool:
        """True when at least one kind carries a complete list."""
        return any(self.report(k) is not None for k in KINDS)


class ReasonInput(BaseModel):
    """Signals ``force_reap`` and ``drain``: ``{"reason": "text"}``; ``actor`` says who asked."""

    model_config = ConfigDict(extra="ignore")

    reason: Text = Field(default="", max_length=1000)
    actor: Text = Field(default="operator", max_length=200)
    boot_id: Text | None = Field(default=None, max_length=253)
    """``retire`` only, optional (beyond the contract): the boot it retires; a retire that
    arrives after another boot beat is ignored (``policy.fleet.retire_is_stale``)."""


class DrainInput(ReasonInput):
    """Signal and update ``drain`` (CONTRACT.md §5.1, §6.1): ``{"reason": "text",
    "migrate": true, "deadline": "30m"}``. Without ``migrate`` it is the v1 drain (nothing new
    is placed on the worker); with it the worker's tasks are moved, replacement first, and
    what is left at the ``deadline`` (a duration as in §1; absent: ``REAPER_DRAIN_DEADLINE``)
    is stopped and backfilled."""

    migrate: StrictBool = False
    deadline: Seconds | None = None


class StateView(BaseModel):
    """Query ``state`` (CONTRACT.md section 2).

    ``state`` is never ``draining`` here (that shows only in the search attribute).
    """

    worker: str
    state: str
    boot_id: str | None
    last_seq: int | None
    last_heartbeat_at: datetime | None
    missing: int
    assignments: list[str]
    orphans: list[str]
    draining: bool
    state_since: datetime | None
    rejected: int
    last_rejection: str | None
    ignored: int = 0
    missing_by_kind: dict[str, int]
    report_digests: dict[str, str] = Field(default_factory=dict)
    """Per kind, digest of the last complete report the controller holds: an agent whose
    own digest differs must send its complete list again (protocol extension)."""
    orphans_by_kind: dict[str, list[str]] = Field(default_factory=dict)
    """``orphans`` split by kind, so an agent removes each from the right place."""
    pending_reports: int = 0
    """Complete reports received but not yet handed to the collector."""
    forwarded_reports: int = 0
    """Complete reports handed to the collector so far."""
    drained: bool = False
    """CONTRACT.md §6.2: the worker drains and holds no ``pending`` or ``running`` task (an
    autoscaler may terminate its host, then ``retire`` it)."""
