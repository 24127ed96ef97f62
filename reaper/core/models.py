"""The workflows' own inputs and state (not part of the public contract).

One model per workflow input (``<Thing>Input``) so that adding a field never breaks a caller;
each crosses Temporal as JSON through ``pydantic_data_converter``.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from reaper.core.contract import Kind, ReasonInput, WorkerState


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
