"""The workflows' own inputs and state (not part of the public contract).

One model per workflow input (``<Thing>Input``) so that adding a field never breaks a caller;
each crosses Temporal as JSON through ``pydantic_data_converter``.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from reaper.core.config import Settings
from reaper.core.contract import Kind
from reaper.core.policy.auth import AuthMode
from reaper.core.policy.collection import carries_also_seen, coalesce, recheck_at
from reaper.core.policy.rollout import DEFAULT_PEER_VERSION


class Timings(BaseModel):
    """The durations (seconds) and switches a workflow runs with: a copy of the controller's
    settings (:meth:`of`), which hold the one set of defaults (``reaper.core.config``)."""

    heartbeat_interval: float
    stall_after: float
    lost_after: float
    missing_ttl: float
    creating_timeout: float
    retire_after: float
    # Absent from runs of the 1.1 line: a migrating drain's default deadline (§6.1).
    drain_deadline: float = 3600.0
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
    # The controller's REAPER_PEER_VERSION, recorded by each run's start-up read: which
    # command changes the run takes (``reaper.core.policy.rollout``).
    peer_version: str = DEFAULT_PEER_VERSION

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
    queued_also_seen: list[str] = Field(default_factory=list)
    """Handles of older reports this one superseded in the collector's queue, after the
    liveness sealed each report alone: outside the seal, so the collector never changes
    what the liveness sealed. They only restart clocks (rule 4's safe side)."""
    queued_restart_all: bool = False
    """As ``restart_all``, for a report superseded in the collector's queue (outside the seal)."""


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


def supersede_queued(older: Report | None, newer: Report) -> Report:
    """``newer`` taking the place of ``older`` (if any) in the collector's queue (rule 4, as
    :func:`supersede`), its sealed fields as the liveness sealed them.

    What ``older`` saw (its handles, ``also_seen`` and its own queued extras) goes to
    ``queued_also_seen`` or ``queued_restart_all``: the liveness sealed each report alone,
    and a report whose sealed fields changed is refused (``activities.sealing``), which left
    the newest report of a kind unreconciled until ``FULL_RESYNC_INTERVAL`` (chaos smoke,
    2026-12-05). ``newer``'s own queued fields are dropped: only this queue sets them.
    """
    fresh = newer.model_copy(update={"queued_also_seen": [], "queued_restart_all": False})
    if older is None:
        return fresh
    merged = supersede(
        older.model_copy(
            update={
                "also_seen": sorted({*older.also_seen, *older.queued_also_seen}),
                "restart_all": older.restart_all or older.queued_restart_all,
            }
        ),
        fresh,
    )
    if merged.restart_all and not newer.restart_all:
        return fresh.model_copy(update={"queued_restart_all": True})
    extra = sorted(set(merged.also_seen) - set(newer.also_seen))
    if not carries_also_seen([*newer.also_seen, *extra]):
        return fresh.model_copy(update={"queued_restart_all": True})
    return fresh.model_copy(update={"queued_also_seen": extra})


class GcStatusInput(BaseModel):
    """Signal ``gc_status`` from the collector to the liveness: one kind's latest numbers."""

    kind: Kind
    status: KindStatus
    assignments: list[str] | None = None
    drained: bool | None = None
    """Whether the worker is drained (§6.2), as a tasks reconcile read it; ``None``: not
    said (a collector of the 1.1 line, or another kind)."""


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
    in_task: bool = True
    """``in-task-loss``: the reap's transaction runs as a local activity in the child's first
    workflow task. Always so since 1.2; sent as ``True`` for a 1.1.0 controller serving
    beside this release, which reads it."""


class DeadlinesView(BaseModel):
    """Query ``deadlines`` of a liveness (not in the contract; ``reaper explain`` asks it):
    when the controller next judges the worker, by the settings it judges it with.

    Attributes:
        state: the worker's state, as the ``state`` query says.
        next_deadline: when its silence next moves it (UTC): ``STALL_AFTER`` or
            ``LOST_AFTER`` after its last beat, never before an outage grace ends; ``None``
            before its first beat and once it is lost.
        grace_until: the end of an outage grace (UTC), if one was granted.
        timings: the settings the liveness's run read (the controller's, not the shell's).
    """

    state: str
    next_deadline: datetime | None = None
    grace_until: datetime | None = None
    timings: Timings | None = None


class ReapResult(BaseModel):
    """What one reap did: tasks marked ``lost`` and replacements placed (``(new_id, worker)``)."""

    refused: str | None = None
    retry_at: datetime | None = None
    lost_tasks: list[str] = Field(default_factory=list)
    replacements: list[tuple[str, str]] = Field(default_factory=list)
    owed: int = 0
    """Replacements created with no worker (no placeable worker): owed work (§5.1)."""
