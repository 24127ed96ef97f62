"""Inputs and results of the activities (one model each, so fields can be added safely)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from reaper.core.contract import Kind, WorkerState
from reaper.core.liveness_state import DrainRequest
from reaper.core.models import KindStatus, Report, Timings


class WorkerStateChange(BaseModel):
    """Record a worker's liveness in ``reaper.workers`` (and an ``events`` row if it changed)."""

    worker: str
    state: WorkerState
    at: datetime
    boot_id: str | None = None
    last_seq: int | None = None
    last_heartbeat_at: datetime | None = None
    reason: str | None = None
    actor: str | None = None
    returned_at: datetime | None = None
    """The worker's latest return after ``STALL_AFTER`` of silence (UTC), if any: its marks
    are cleared once per return, even a silence the liveness had no chance to judge."""
    forced_reap: bool = False
    """The worker is ``lost`` because an operator's ``force_reap`` was accepted: recorded as
    ``workers.force_reap_at``, the evidence a forced reap needs (CONTRACT.md §5.2)."""
    complete_at: dict[str, datetime] = Field(default_factory=dict)
    """Per kind, when the worker's beats last carried a complete report of it (UTC), as the
    liveness holds it: written to ``workers.<kind>_complete_at`` (never backwards). Absent
    from the inputs of older controllers, which then write nothing there."""


class HeartbeatRefresh(BaseModel):
    """Bring ``workers.last_seq`` and ``last_heartbeat_at`` up to the liveness's (§5.3) when
    nothing else about the worker changed. Times UTC."""

    worker: str
    boot_id: str
    last_seq: int
    last_heartbeat_at: datetime
    complete_at: dict[str, datetime] = Field(default_factory=dict)
    """As :attr:`WorkerStateChange.complete_at`."""


class FleetView(BaseModel):
    """The fleet's disruption state as stored in ``reaper.fleet`` (CONTRACT.md rule 6)."""

    state: str
    healthy: int
    unhealthy: int
    since: datetime | None = None
    recovered_at: datetime | None = None


class RecordResult(BaseModel):
    """What ``record_worker_state`` did."""

    fleet: FleetView | None = None
    """The fleet's state, recomputed because the worker's state changed; else ``None``."""
    marks_cleared: bool = False
    """A return cleared the worker's marks (its ``missing`` counts are 0 until its next
    report)."""


class WorkerRecord(BaseModel):
    """A worker's row as Postgres holds it (``state`` ``None``: no row)."""

    state: WorkerState | None = None
    boot_id: str | None = None


class BeginRun(BaseModel):
    """What a liveness run reads before it acts: always its timings; ``worker``'s pinned key
    unless ``key_known``; on a ``first`` run (not continued as new) its ``workers`` row."""

    worker: str
    first: bool
    key_known: bool


class RunStart(BaseModel):
    """The answer to :class:`BeginRun` (``agent_key`` ``None`` when not read, or when
    authentication is off or nothing is pinned; ``record`` ``None`` when not read)."""

    timings: Timings
    agent_key: str | None = None
    record: WorkerRecord | None = None


class UpkeepResult(BaseModel):
    """What ``fleet_upkeep`` did: tasks placed (``(task_id, worker)``), strays' replacements
    included, for the fleet monitor to tell those workers."""

    placed: list[tuple[str, str]] = Field(default_factory=list)


class RepairResult(BaseModel):
    """What ``repair_stuck`` did: suspect workers looked at, livenesses reset, and stuck
    livenesses left alone (no replayable reset point, or a failure other than a
    nondeterminism)."""

    suspects: int = 0
    repaired: list[str] = Field(default_factory=list)
    unrepairable: list[str] = Field(default_factory=list)


class RetireRequest(BaseModel):
    """Retire ``worker`` (CONTRACT.md §5.1); ``automatic`` when no operator or agent asked."""

    worker: str
    reason: str
    actor: str
    automatic: bool
    at: datetime
    """The controller's (workflow) time, UTC."""
    retire_after: float
    dry_run: bool = False


class DrainChange(BaseModel):
    """Input of ``set_draining``: the newest drain or undrain request of ``worker`` (its
    ``draining``, ``reason``, ``actor`` and ``key``, as ``DrainRequest`` has them), and the
    unapplied ones that came before it, oldest first (``policy.drain``). A controller of
    release 1.0 ignores ``key`` and ``earlier`` and applies the newest alone, as it did."""

    worker: str
    draining: bool
    reason: str = ""
    actor: str = "operator"
    key: str = ""
    earlier: list[DrainRequest] = Field(default_factory=list)
    migrate: bool = False
    deadline: float | None = None
    at: datetime | None = None
    """``drain_worker``: when the requests are applied (UTC, the workflow's clock): a
    migration's deadline counts from here."""
    default_deadline: float = 3600.0
    """``drain_worker``: a migration's deadline when its request names none
    (``REAPER_DRAIN_DEADLINE``, seconds)."""

    def requests(self) -> list[DrainRequest]:
        """Every request of the change, oldest first."""
        newest = DrainRequest(
            draining=self.draining,
            reason=self.reason,
            actor=self.actor,
            key=self.key,
            migrate=self.migrate,
            deadline=self.deadline,
        )
        return [*self.earlier, newest]


class DrainOutcome(BaseModel):
    """What ``drain_worker`` did and what the worker's row says after it (§5.1, §6)."""

    changed: list[str] = Field(default_factory=list)
    """The keys of the requests that changed the worker."""
    draining: bool = False
    migrate_until: datetime | None = None
    drained_at: datetime | None = None
    cancelled: list[str] = Field(default_factory=list)
    """Replacements an undrain stopped before they ran."""


class SealedReport(BaseModel):
    """The fields of a forwarded report that its seal covers (``activities.sealing``)."""

    digest: str
    taken_at: datetime
    boot_id: str
    staged_id: str | None = None
    restart_all: bool = False
    also_seen: list[str] = Field(default_factory=list)
    seal: str = ""

    @classmethod
    def of(cls, report: Report) -> SealedReport:
        """The sealed fields of ``report``."""
        return cls(**report.model_dump(include=set(cls.model_fields)))


class ReconcileInput(BaseModel):
    """Diff one complete report of ``kind`` against the rows of ``worker``."""

    worker: str
    kind: Kind
    handles: list[str]
    taken_at: datetime
    missing_ttl: float
    also_seen: list[str] = Field(default_factory=list)
    restart_all: bool = False
    staged_id: str | None = None
    """Diff against the chunks staged under this report id instead of ``handles``."""
    creating_timeout: float = 3600.0
    dry_run: bool = False
    confirmed: bool = False
    """Skip the mass-drop check: a second report confirmed it, or the worker rebooted."""
    max_drop_fraction: float = 0.5
    suspect_min_handles: int = 10
    report: SealedReport | None = None
    """What the seal covers (``handles`` aside); without a valid seal nothing is done."""


class ReconcileResult(BaseModel):
    skipped: str | None = None
    suspect: str | None = None
    """Set when the report dropped too many handles at once and so marked nothing."""
    marked: int = 0
    cleared: int = 0
    started: list[str] = Field(default_factory=list)
    status: KindStatus = Field(default_factory=KindStatus)
    assignments: list[str] | None = None
    drained: bool | None = None
    """Tasks only: whether the worker is drained (§6.2, ``workers.drained_at``)."""


class DestroyInput(BaseModel):
    """Destroy ``worker``'s rows of ``kind`` missing since at or before ``cutoff`` (UTC)."""

    worker: str
    kind: Kind
    cutoff: datetime
    missing_ttl: float
    dry_run: bool = False
    report: SealedReport | None = None
    """The report whose evidence makes rows due; ``cutoff`` must follow from its
    ``taken_at`` and ``missing_ttl``, and it must be sealed."""


class DestroyResult(BaseModel):
    refused: str | None = None
    destroyed: list[str] = Field(default_factory=list)
    replacements: list[tuple[str, str]] = Field(default_factory=list)
    status: KindStatus = Field(default_factory=KindStatus)


class PinRequest(BaseModel):
    """Pin ``public_key`` (standard base64 Ed25519) for ``worker`` (CONTRACT.md §5.2)."""

    worker: str
    public_key: str


class ReapRequest(BaseModel):
    """Reap ``worker``: its tasks ``lost``, its services backfilled (CONTRACT.md rule 5)."""

    worker: str
    reason: str
    actor: str
    forced: bool
    lost_after: float
    at: datetime
    """The controller's (workflow) time of the reap, UTC."""
    last_heartbeat_at: datetime | None = None
    dry_run: bool = False


class StageChunk(BaseModel):
    """Stage one chunk of a large report in ``reaper.report_chunks``."""

    worker: str
    kind: Kind
    report_id: str
    index: int
    count: int
    digest: str
    handles: list[str]
    keep: str | None = None
    """Report id of the last complete staged report of this kind, kept for digest beats;
    chunks of every other report id of the worker and kind are dropped."""


class StageResult(BaseModel):
    """What :meth:`stage_chunk` found after storing one chunk."""

    chunks_staged: int
    """Chunks of ``report_id`` present after this call."""
    complete: bool = False
    digest_ok: bool = True
    """False when the complete report's handles do not hash to ``digest`` (it was dropped)."""
