"""Drain and undrain (CONTRACT.md §5.1): which operator requests a liveness keeps until it
applies them, and which of them change ``workers.draining``.

A draining worker gets no new placements (Kubernetes' cordon, Nomad's node drain). Each
change is an ``events`` row, ``drain`` or ``undrain``, with the request's reason and actor.
Requests that reach a liveness together (in one workflow task, or while no controller
served it) are applied in the order they arrived, so a ``drain`` followed at once by an
``undrain`` leaves both rows and ends undrained, as it does when each is applied alone.
Before this, the newer request replaced an unapplied older one: the ``drain`` left no trace
and the ``undrain``, finding nothing to change, wrote no row either.

Pure: no I/O, no Temporal. Tested in tests/policy/test_drain.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from reaper.core.liveness_state import DrainRequest
from reaper.core.policy.migration import starts_migration

MAX_QUEUED = 16
"""The most drain and undrain requests a liveness holds unapplied (at least 2): what a
sender that alternates them faster than the controller applies them can make it keep."""


def queue_drain(
    queued: Sequence[DrainRequest], request: DrainRequest, limit: int = MAX_QUEUED
) -> tuple[list[DrainRequest], int]:
    """Take ``request`` into the unapplied requests ``queued`` (oldest first).

    A request that sets what the last queued one sets would change nothing after it and is
    dropped: the rows record the first (so too when each is applied alone). Queued requests
    therefore alternate. When ``limit`` are queued, a new request undoes the last one: both
    are dropped, the outcome is the same and only their two ``events`` rows are not written.

    Args:
        queued: the requests not yet applied, oldest first (not changed).
        request: the newest one.
        limit: the most requests kept (at least 2, so that dropping a pair keeps the outcome).

    Returns:
        The requests to keep, oldest first, and how many requests this dropped (0, 1 or 2).

    Raises:
        ValueError: ``limit`` is below 2.
    """
    if limit < 2:
        raise ValueError(f"limit must be at least 2, not {limit}")
    if queued and sets_the_same(queued[-1], request):
        return list(queued), 1
    if len(queued) >= limit:
        return list(queued[:-1]), 2
    return [*queued, request], 0


def sets_the_same(before: DrainRequest, request: DrainRequest) -> bool:
    """Whether ``request`` changes nothing after ``before``: the same direction, and no
    migration asked for that ``before`` did not ask for (a migrating ``drain`` after a plain
    one starts the migration, §6.1)."""
    return before.draining == request.draining and (before.migrate or not request.migrate)


@dataclass(frozen=True)
class DrainEffect:
    """What applying one request does (:func:`drain_effects`).

    Attributes:
        request: the request.
        draining: it changes ``workers.draining`` (an ``events`` row ``drain`` or
            ``undrain``).
        migrates: it starts a migration (§6.1): ``migrate_until`` is set.
        cancels: an ``undrain`` that ends a migration that runs (§6.1).
    """

    request: DrainRequest
    draining: bool = False
    migrates: bool = False
    cancels: bool = False

    @property
    def changes(self) -> bool:
        """Whether it changed the worker at all (what an update answers)."""
        return self.draining or self.migrates


def drain_effects(
    draining: bool, migrate_until: datetime | None, requests: Sequence[DrainRequest], at: datetime
) -> list[DrainEffect]:
    """What each of ``requests`` does, applied in order at ``at`` (UTC) to a worker whose row
    says ``draining`` and ``migrate_until`` (a migration's deadline; ``None``: none runs): a
    drain of a worker not draining drains it; a drain with ``migrate`` also starts a
    migration if none runs (``policy.migration.starts_migration``), even of a worker that
    drains already; an undrain of a draining worker undrains it and ends its migration."""
    effects = []
    running = migrate_until is not None and not starts_migration(True, migrate_until, at)
    for request in requests:
        if request.draining:
            migrates = request.migrate and not running
            effect = DrainEffect(request, draining=not draining, migrates=migrates)
            running = running or migrates
        else:
            effect = DrainEffect(request, draining=draining, cancels=migrate_until is not None)
            running, migrate_until = False, None
        draining = request.draining
        effects.append(effect)
    return effects


def drain_changes(draining: bool, requests: Sequence[DrainRequest]) -> list[DrainRequest]:
    """The requests that change ``workers.draining`` when applied in order, from
    ``draining`` (the row's value before them): one ``events`` row each, and the row ends at
    the last request's value."""
    changes = []
    for request in requests:
        if request.draining != draining:
            changes.append(request)
            draining = request.draining
    return changes
