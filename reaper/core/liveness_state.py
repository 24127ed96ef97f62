"""The state of a liveness run, in one value (``LivenessState``), its start input, and the
pieces it holds: a report being staged, the run's features, a pending drain, queued chunks.

Not part of the public contract; each crosses Temporal as JSON through
``pydantic_data_converter`` (continue-as-new hands the whole value to the next run).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from reaper.core.contract import ReasonInput, ReportChunk, WorkerState
from reaper.core.models import KindStatus, Report, Timings


class LivenessInput(BaseModel):
    """Start input of ``WorkerLiveness``: ``{"worker": "<name>"}`` (contract), plus the
    state carried across continue-as-new."""

    model_config = ConfigDict(extra="ignore")

    worker: str
    carried: LivenessState | None = None


class Staging(BaseModel):
    """A chunked report being received: how many of its chunks are staged in Postgres."""

    report_id: str
    count: int
    digest: str
    taken_at: datetime
    boot_id: str
    chunks_staged: int = 0
    restart_all: bool = False
    """The report superseded chunks that were dropped unstaged: it restarts every mark of
    its kind (``policy.collection.superseded_chunks``)."""


class RunFeatures(BaseModel):
    """What a liveness run does beyond what every run of this line does, decided once at its
    start from the peer version its start-up read recorded (``workflows/run_start.py``,
    ``reaper.core.policy.rollout``), so a replay decides the same; a new run decides again.
    1.2 made every change of 1.1 the rule."""

    changes: list[str] = Field(default_factory=list)
    """The command changes of ``rollout.COMMAND_CHANGES`` this run uses
    (``rollout.in_use``)."""

    def uses(self, change: str) -> bool:
        """Whether this run uses command change ``change`` (a key of
        ``rollout.COMMAND_CHANGES``, such as ``rollout.ROTATING_HOSTS``)."""
        return change in self.changes


class DrainRequest(BaseModel):
    """An operator's ``drain`` (``draining``) or ``undrain``, not yet applied
    (``policy.drain``)."""

    draining: bool
    reason: str = ""
    actor: str = "operator"
    migrate: bool = False
    """A migrating drain (§6.1): move the worker's tasks, replacement first."""
    deadline: float | None = None
    """The migration's deadline, seconds after it is applied (``None``:
    ``REAPER_DRAIN_DEADLINE``)."""
    key: str = ""
    """The ``events.dedupe`` key of the row it writes if it changes ``workers.draining``,
    unique to the request (run id and a count): a retried ``set_draining`` that finds it
    written knows its batch is applied. Empty in requests of runs recorded before it."""


class QueuedChunk(BaseModel):
    """A chunk of a large report waiting to be staged in Postgres, with when its beat was
    taken (UTC), the beat's boot id, and whether that beat was the worker's return."""

    chunk: ReportChunk
    taken_at: datetime
    boot_id: str
    returned: bool
    restart_all: bool = False
    """Older reports' chunks were dropped in favour of this chunk's report: it restarts
    every mark of its kind (``policy.collection.superseded_chunks``)."""


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
    graced_at: datetime | None = None
    """The late look (UTC) that granted this silence's outage grace, while no look since was
    on time: a later late look grants no other (``one-grace``). An accepted beat or a look on
    time clears it."""
    looked_late_at: datetime | None = None
    """The last late look judged (UTC): a task that asks again (the timer fired, then the
    clock is judged) judges it once."""
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
    migrate_until: datetime | None = None
    """The deadline (UTC) of the migrating drain that runs, as its drain wrote it (§6.1)."""
    drained_at: datetime | None = None
    """When the worker was drained (§6.2: draining and holding no pending or running task),
    as Postgres says; ``None``: not drained."""
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
    complete_at: dict[str, datetime] = Field(default_factory=dict)
    """Per kind, when the worker's beats last carried a complete report of it (UTC; inline,
    digest-only of a report held, or the last chunk of a staged one); written to the row with
    ``last_heartbeat_at`` (``workers.<kind>_complete_at``, ``policy.reports``). Runs recorded
    before it start empty."""
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
    drains: list[DrainRequest] = Field(default_factory=list)
    """``drain`` and ``undrain`` requests not yet applied, oldest first
    (``policy.drain.queue_drain``; a run hands over only once they are)."""
    drains_taken: int = 0
    """Drain and undrain requests taken so far (carried across continue-as-new): the count
    in each one's ``key``."""
    drains_done: int = 0
    """Drain and undrain requests applied or dropped so far (the count of the newest): an
    update waits for its request's count (``rotating-hosts``)."""
    drain_answers: dict[str, bool] = Field(default_factory=dict)
    """For the newest applied requests (at most ``policy.drain.MAX_QUEUED``), their key ->
    whether it changed the worker: what a ``drain`` or ``undrain`` update answers."""
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


LivenessInput.model_rebuild()
