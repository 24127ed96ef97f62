"""Payloads: the contract's signal and query shapes, and the workflows' own inputs and state.

Every model here crosses Temporal as JSON through ``pydantic_data_converter``. Inputs are one
model per workflow or signal (``<Thing>Input``) so that adding a field never breaks a caller.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import Enum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, model_validator

WORKER_NAME = re.compile(r"^[A-Za-z0-9._:-]{1,253}$")
"""A worker name: 1-253 characters of ``[A-Za-z0-9._:-]`` (CONTRACT.md section 2)."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

KINDS: tuple[str, ...] = ("containers", "volumes", "tasks")
"""The kinds of handle a report carries, which are also the tables they live in."""

Kind = Literal["containers", "volumes", "tasks"]


def _check_worker(value: str) -> str:
    if not WORKER_NAME.match(value):
        raise ValueError("worker must be 1-253 characters of [A-Za-z0-9._:-]")
    return value


def _check_handle(value: str) -> str:
    if not 1 <= len(value) <= 512:
        raise ValueError("a handle is 1-512 characters")
    if _CONTROL.search(value):
        raise ValueError("a handle may not contain control characters")
    return value


def _check_boot_id(value: str) -> str:
    if not 1 <= len(value) <= 128 or _CONTROL.search(value):
        raise ValueError("boot_id must be 1-128 characters without control characters")
    return value


WorkerName = Annotated[str, AfterValidator(_check_worker)]
Handle = Annotated[str, AfterValidator(_check_handle)]
BootId = Annotated[str, AfterValidator(_check_boot_id)]


class WorkerState(str, Enum):
    """A worker's liveness state; names follow Kubernetes' node lifecycle (Ready/Unknown)."""

    running = "running"
    stalled = "stalled"
    lost = "lost"


_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _check_digest(value: str) -> str:
    if not _HEX64.match(value):
        raise ValueError("a digest is 64 lowercase hex characters (sha256, reaper.rules.report_digest)")
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
    def _index_in_range(self) -> "ReportChunk":
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
    seq: StrictInt = Field(ge=0)
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

    reason: str = Field(default="", max_length=1000)
    actor: str = Field(default="operator", max_length=200)


class LivenessInput(BaseModel):
    """Start input of ``WorkerLiveness``: ``{"worker": "<name>"}`` (contract), plus carried state."""

    model_config = ConfigDict(extra="ignore")

    worker: str
    carried: "LivenessState | None" = None


class Timings(BaseModel):
    """The durations a workflow runs with, in seconds; copied from settings by the controller."""

    heartbeat_interval: float = 10.0
    stall_after: float = 30.0
    lost_after: float = 300.0
    missing_ttl: float = 300.0
    creating_timeout: float = 3600.0
    resync_interval: float = 30.0
    disruption_threshold: float = 0.55
    dry_run: bool = False
    max_drop_fraction: float = 0.5
    suspect_min_handles: int = 10


class KindStatus(BaseModel):
    """What the collector last found for one kind of handle on one worker."""

    missing: int = 0
    orphans: list[str] = Field(default_factory=list)
    next_due: datetime | None = None
    """UTC time at which the oldest missing handle will have been missing for ``MISSING_TTL``."""


class Report(BaseModel):
    """One complete report of one kind, as forwarded from the liveness to the collector."""

    kind: Kind
    handles: list[str]
    taken_at: datetime
    """Controller time (UTC) at which the heartbeat carrying the report was received."""
    boot_id: str
    digest: str = ""
    staged: str | None = None
    """Report id whose chunks are staged in ``reaper.report_chunks``; ``handles`` is then
    empty and the collector diffs against the staged rows."""
    also_seen: list[str] = Field(default_factory=list)
    """Handles present in earlier reports that this one superseded before they were
    reconciled: each was seen after any mark it had, so its ``missing_since`` restarts."""
    restart_all: bool = False
    """A superseded report was staged (its handles are not at hand): restart every mark of
    this kind, the safe side of ``also_seen``."""


class GcStatusInput(BaseModel):
    """Signal ``gc_status`` from the collector to the liveness: one kind's latest numbers."""

    kind: Kind
    status: KindStatus
    assignments: list[str] | None = None


class Staging(BaseModel):
    """A chunked report being received: which chunks are staged in Postgres."""

    report_id: str
    count: int
    digest: str
    taken_at: datetime
    boot_id: str
    staged: int = 0


class LivenessState(BaseModel):
    """All state of one ``WorkerLiveness`` run: the value handed over at continue-as-new."""

    worker: str
    state: WorkerState = WorkerState.running
    state_since: datetime | None = None
    draining: bool = False
    drain_reason: str | None = None
    boot_id: str | None = None
    last_seq: int = -1
    last_heartbeat_at: datetime | None = None
    previous_boot_ids: list[str] = Field(default_factory=list)
    registered: bool = False
    """The ``workers`` row exists (written by the first ``record_worker_state``)."""
    recorded_state: WorkerState | None = None
    """The state last written to Postgres; differs from ``state`` while a write is pending."""
    returned_at: datetime | None = None
    """UTC time of the worker's latest return to ``running`` after ``STALL_AFTER`` or more of
    silence (judged or not): reports taken before it never decide (CONTRACT.md rule 4)."""
    recorded_return: datetime | None = None
    """The ``returned_at`` last written to Postgres (its marks cleared as of that return)."""
    grace_until: datetime | None = None
    """No reap before this time (set after an outage or a fleet recovery)."""
    reaps: int = 0
    """Reaps started so far; the next reap child is ``reap-{worker}-{reaps + 1}``."""
    reap_pending: ReasonInput | None = None
    reaped_boot_id: str | None = None
    """The boot id the worker had when it was last reaped."""
    pending: dict[str, Report] = Field(default_factory=dict)
    """Latest unforwarded complete report per kind."""
    forwarded_digest: dict[str, str] = Field(default_factory=dict)
    forwarded_at: dict[str, datetime] = Field(default_factory=dict)
    wanted: list[str] = Field(default_factory=list)
    """Kinds whose next complete report goes to the collector even if unchanged (a TTL fell
    due, or a nudge after a placement)."""
    reap_forced: bool = False
    reap_retry_at: datetime | None = None
    status: dict[str, KindStatus] = Field(default_factory=dict)
    assignments: list[str] = Field(default_factory=list)
    rejected: int = 0
    last_rejection: str | None = None
    ignored: int = 0
    """Well-formed beats dropped by the fence (duplicate, late, or from an older boot)."""
    collector_started: bool = False
    forwarded: int = 0
    """Reports handed to the collector so far."""
    timings: Timings | None = None
    fleet_recovered_at: datetime | None = None
    last_reports: dict[str, Report] = Field(default_factory=dict)
    """Per kind, the last complete report received (handles kept only for small reports;
    large ones by their staged id): what a digest-only beat refers to."""
    staging: dict[str, "Staging"] = Field(default_factory=dict)


class StateView(BaseModel):
    """Query ``state`` (CONTRACT.md section 2); ``state`` is ``draining`` only in search attributes."""

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


class CollectorInput(BaseModel):
    """Start input of ``HandleCollector`` (workflow id ``gc-{worker}``)."""

    worker: str
    timings: Timings
    queued: list[Report] = Field(default_factory=list)
    due: dict[str, datetime] = Field(default_factory=dict)
    processed: int = 0
    """Reports reconciled by earlier runs (carried across continue-as-new)."""
    boots: dict[str, str] = Field(default_factory=dict)
    """Per kind, the boot id of the last reconciled report."""


class ReapInput(BaseModel):
    """Start input of ``WorkerReap`` (workflow id ``reap-{worker}-{n}``)."""

    worker: str
    reason: str
    actor: str
    forced: bool
    lost_after: float = 300.0
    last_heartbeat_at: datetime | None = None
    dry_run: bool = False


class ReapResult(BaseModel):
    """What one reap did: tasks marked ``lost`` and replacements placed (``(new_id, worker)``)."""

    refused: str | None = None
    retry_at: datetime | None = None
    lost_tasks: list[str] = Field(default_factory=list)
    replacements: list[tuple[str, str]] = Field(default_factory=list)
    unplaced: int = 0


LivenessInput.model_rebuild()
