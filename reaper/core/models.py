"""The workflows' own inputs and state (not part of the public contract).

One model per workflow input (``<Thing>Input``) so that adding a field never breaks a caller;
each crosses Temporal as JSON through ``pydantic_data_converter``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from reaper.core.config import Settings
from reaper.core.contract import Kind, ReasonInput, ReportChunk, WorkerState
from reaper.core.policy.auth import AuthMode
from reaper.core.policy.collection import carries_also_seen, coalesce, recheck_at


class LivenessInput(BaseModel):
    """Start input of ``WorkerLiveness``: ``{"worker": "<name>"}`` (contract), plus the
    state carried across continue-as-new."""

    model_config = ConfigDict(extra="ignore")

    worker: str
    carried: LivenessState | None = None


class Timings(BaseModel):
    """The durations (seconds) and switches a workflow runs with: a copy of the controller's
    settings (:meth:`of`), which hold the one set of defaults (``reaper.core.config``)."""

    heartbeat_interval: float
    stall_after: float
    lost_after: float
    missing_ttl: float
    creating_timeout: float
    retire_after: float
    resync_interval: float
    disruption_threshold: float
    dry_run: bool
    max_drop_fraction: float
    suspect_min_handles: int
    # Absent from histories recorded before CONTRACT.md §5.2: those replay as v1 ("off").
    agent_auth: AuthMode = AuthMode.off
    operator_keys: tuple[str, ...] = ()
    """Operators' public keys (never a secret: public keys may appear in history)."""
    # Absent from histories recorded before the change feed: those resync every
    # ``resync_interval`` (patch ``change-feed``).
    full_resync_interval: float | None = None

    @classmethod
    def of(cls, settings: Settings) -> Timings:
        """The workflow timings of ``settings``."""
        return cls(**settings.model_dump(include=set(cls.model_fields)))


class KindStatus(BaseModel):
    """What the collector last found for one kind of handle on one worker."""

    model_config = ConfigDict(
        validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )

    missing: int = 0
    orphans: list[str] = Field(default_factory=list)
    next_due: datetime | None = None
    """UTC time at which the oldest missing handle will have been missing for ``MISSING_TTL``."""
    recheck_due: datetime | None = Field(default=None, alias="orphan_due")
    """UTC time at which the kind's next time rule other than the destroy falls due, on the
    next report: the oldest reported-but-unknown handle becomes an orphan (``MISSING_TTL``
    after it was first reported), or the oldest row being created times out
    (``CREATING_TIMEOUT``); ``reaper.core.policy.time_rules``. On the wire it keeps the
    name ``orphan_due``, under which release 1.0.0's collectors read it, so a collector of
    either release keeps the same timer on the same history (CHANGELOG.md)."""

    def recheck_at(self) -> datetime | None:
        """When the collector next needs a fresh report of this kind (UTC), or ``None``
        (``policy.collection.recheck_at``)."""
        return recheck_at(self.next_due, self.recheck_due)


class Report(BaseModel):
    """One complete report of one kind, as forwarded from the liveness to the collector."""

    kind: Kind
    handles: list[str]
    taken_at: datetime
    """Controller time (UTC) at which the heartbeat carrying the report was received."""
    boot_id: str
    digest: str = ""
    staged_id: str | None = None
    """Report id whose chunks are staged in ``reaper.report_chunks``; ``handles`` is then
    empty and the collector diffs against the staged rows."""
    also_seen: list[str] = Field(default_factory=list)
    """Handles present in earlier reports that this one superseded before they were
    reconciled: each was seen after any mark it had, so its ``missing_since`` restarts."""
    seal: str = ""
    """The liveness's seal (``activities.sealing``): the collector acts only on sealed reports."""
    restart_all: bool = False
    """A superseded report was staged (its handles are not at hand): restart every mark of
    this kind, the safe side of ``also_seen``."""


def supersede(older: Report, newer: Report) -> Report:
    """``newer`` carrying what an unreconciled ``older`` report of its kind saw (rule 4).

    Only the latest complete report needs diffing, but handles that ``older`` held were
    seen after any mark they had: their clocks restart (``also_seen``; every mark when the
    handles are not at hand because either report is staged, or when they are more than
    ``policy.collection.ALSO_SEEN_MAX_BYTES``).
    """
    if older.staged_id is not None or newer.staged_id is not None or older.restart_all:
        return newer.model_copy(update={"restart_all": True})
    also_seen = coalesce(older.handles, older.also_seen, newer.handles)
    if not carries_also_seen(also_seen):  # too many to carry in a command: restart all
        return newer.model_copy(update={"restart_all": True})
    return newer.model_copy(update={"also_seen": also_seen})


class GcStatusInput(BaseModel):
    """Signal ``gc_status`` from the collector to the liveness: one kind's latest numbers."""

    kind: Kind
    status: KindStatus
    assignments: list[str] | None = None


class Staging(BaseModel):
    """A chunked report being received: how many of its chunks are staged in Postgres."""

    report_id: str
    count: int
    digest: str
    taken_at: datetime
    boot_id: str
    chunks_staged: int = 0


class RunFeatures(BaseModel):
    """What a liveness run does, decided once at its start by its patch markers
    (``workflows/run_start.py``) and recorded in its history; a new run decides again."""

    local_writes: bool = False
    """``lean-start``: the registration and the heartbeat refreshes of the worker's row are
    local activities, and a record remembers what it wrote, not what arrived meanwhile."""
    refresh_at_bound: bool = False
    """``refresh-at-bound``: refreshes once the row's lag nears ``STALL_AFTER``."""
    change_feed: bool = False
    """``change-feed``: an unchanged report is re-diffed every ``FULL_RESYNC_INTERVAL``."""


class DrainRequest(BaseModel):
    """An operator's ``drain`` (``draining``) or ``undrain``, not yet applied."""

    draining: bool
    reason: str = ""
    actor: str = "operator"


class QueuedChunk(BaseModel):
    """A chunk of a large report waiting to be staged in Postgres, with when its beat was
    taken (UTC), the beat's boot id, and whether that beat was the worker's return."""

    chunk: ReportChunk
    taken_at: datetime
    boot_id: str
    returned: bool


class LivenessState(BaseModel):
    """All state of one ``WorkerLiveness`` run, in one value: what its handlers recorded,
    what its loop acts on (``reaper.core.policy.liveness_machine``), and what it hands over
    at continue-as-new. The fields under "this run" are reset when a run starts."""

    worker: str
    timings: Timings | None = None
    # -- liveness (policy.liveness) --
    state: WorkerState = WorkerState.running
    state_since: datetime | None = None
    boot_id: str | None = None
    last_seq: int = -1
    last_heartbeat_at: datetime | None = None
    previous_boot_ids: list[str] = Field(default_factory=list)
    returned_at: datetime | None = None
    """UTC time of the worker's latest return to ``running`` after ``STALL_AFTER`` or more of
    silence (judged or not): reports taken before it never decide (CONTRACT.md rule 4)."""
    grace_until: datetime | None = None
    """No ``lost`` before this time (set after an outage of the controller)."""
    # -- what Postgres holds --
    recorded_state: WorkerState | None = None
    """The state last written to Postgres; differs from ``state`` while a write is pending."""
    recorded_return: datetime | None = None
    """The ``returned_at`` last written to Postgres (its marks cleared as of that return)."""
    recorded_boot_id: str | None = None
    recorded_heartbeat_at: datetime | None = None
    """``last_heartbeat_at`` as last written (it may lag by half of ``STALL_AFTER``, §5.3)."""
    draining: bool = False
    drain_reason: str | None = None
    retired_boot_id: str | None = None
    """The boot id the worker had when it was retired: its beats are ignored (§5.1)."""
    retire_request: ReasonInput | None = None
    retire_automatic: bool = False
    retire_retry_at: datetime | None = None
    # -- reaping --
    reaps: int = 0
    """Reaps started so far; the next reap child is ``reap-{worker}-{reaps + 1}``."""
    reap_request: ReasonInput | None = None
    """A reap to run (the worker is lost, or an operator forced it), until it is done."""
    reap_forced: bool = False
    recorded_forced: bool = False
    """``reap_forced`` as last written (``workers.force_reap_at``): a forced reap waits for it."""
    reap_retry_at: datetime | None = None
    # -- reports (workflows.intake) --
    unforwarded: dict[str, Report] = Field(default_factory=dict)
    """Per kind, the latest complete report not yet handed to the collector."""
    forwarded_digest: dict[str, str] = Field(default_factory=dict)
    forwarded_at: dict[str, datetime] = Field(default_factory=dict)
    wanted: list[str] = Field(default_factory=list)
    """Kinds whose next complete report goes to the collector even if unchanged (a TTL fell
    due, or Postgres changed for this worker)."""
    last_reports: dict[str, Report] = Field(default_factory=dict)
    """Per kind, the last complete report received (handles kept only for small reports;
    large ones by their staged id): what a digest-only beat refers to."""
    staging: dict[str, Staging] = Field(default_factory=dict)
    collector_started: bool = False
    forwarded: int = 0
    """Reports handed to the collector so far."""
    # -- what the collector found, shown by the ``state`` query --
    collected: dict[str, KindStatus] = Field(default_factory=dict)
    assignments: list[str] = Field(default_factory=list)
    rejected: int = 0
    last_rejection: str | None = None
    # -- who may speak for the worker (CONTRACT.md §5.2, policy.auth) --
    agent_key: str | None = None
    """The worker's pinned Ed25519 public key (learned from its first signed beat, or
    enrolled by an operator); public, so it may be in history."""
    agent_key_recorded: bool = False
    """``agent_key`` is written to ``reaper.agent_keys``."""
    used_signatures: dict[str, datetime] = Field(default_factory=dict)
    """Signatures of operator signals that acted -> their ``signed_at``: a replay is refused."""
    ignored: int = 0
    """Well-formed beats dropped by the fence (duplicate, late, or from an older boot)."""
    # -- this run: not yet applied when a run may hand over, reset when a run starts --
    features: RunFeatures = Field(default_factory=RunFeatures)
    drain_request: DrainRequest | None = None
    """A ``drain`` or ``undrain`` not yet applied (a run hands over only once it is)."""
    chunks: list[QueuedChunk] = Field(default_factory=list)
    """Chunks waiting to be staged (a run hands over only once they are)."""
    early: list[tuple[str, Any]] | None = Field(default_factory=list)
    """Signals (name, raw argument) that arrived before this run loaded its settings (who
    may speak depends on them, §5.2): handled, in order, once they are loaded; ``None``
    from then on."""
    collector_stopped: bool = False
    """The collector said it ended (signal ``gc_stopped``), after a retirement."""
    shown: tuple[str, int] | None = None
    """``(ReaperState, ReaperMissing)`` as last upserted by this run (None: not yet)."""


class CollectorState(BaseModel):
    """All state of one ``HandleCollector`` run: the value handed over at continue-as-new."""

    queue: dict[str, Report] = Field(default_factory=dict)
    """Per kind, the next report to reconcile (a newer one supersedes it)."""
    due: dict[str, datetime] = Field(default_factory=dict)
    """Per kind, when the oldest missing handle falls due (UTC)."""
    asked: list[str] = Field(default_factory=list)
    """Kinds due whose fresh report the collector has asked the liveness for."""
    processed: int = 0
    """Reports handled: reconciled, or superseded by a newer one."""
    boots: dict[str, str] = Field(default_factory=dict)
    """Per kind, the boot id of the last reconciled report."""
    suspects: dict[str, str] = Field(default_factory=dict)
    """Per kind, the digest of a report held back as a mass drop, until confirmed."""
    sent: dict[str, GcStatusInput] = Field(default_factory=dict)
    """Per kind, the status last signalled to the liveness (sent again only when changed)."""


class CollectorInput(BaseModel):
    """Start input of ``HandleCollector`` (workflow id ``gc-{worker}``)."""

    worker: str
    timings: Timings
    queued: list[Report] = Field(default_factory=list)
    """Reports to reconcile first (the liveness's first forward)."""
    carried: CollectorState | None = None
    """The previous run's state, at continue-as-new."""


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
    owed: int = 0
    """Replacements created with no worker (no placeable worker): owed work (§5.1)."""


LivenessInput.model_rebuild()
