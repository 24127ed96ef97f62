"""Liveness policy: how a heartbeat is fenced, when a worker is running, stalled or lost.

Pure functions over values (CONTRACT.md §2 and rules 4-6); ``workflows/liveness`` calls them.
All times are timezone-aware UTC ``datetime``s; all durations are seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from enum import Enum

from reaper.core.contract import WorkerState
from reaper.core.states import WORKERS

MAX_REMEMBERED_BOOT_IDS = 16
"""How many earlier boot ids a liveness remembers to refuse late beats from an old boot."""


class Fence(str, Enum):
    """Verdict on a heartbeat's ``(boot_id, seq)`` against what the liveness has seen."""

    accept = "accept"
    new_boot = "new-boot"
    stale_seq = "stale-seq"
    old_boot = "old-boot"

    @property
    def accepted(self) -> bool:
        return self in (Fence.accept, Fence.new_boot)


def fence(
    current_boot_id: str | None,
    last_seq: int,
    previous_boot_ids: Iterable[str],
    boot_id: str,
    seq: int,
) -> Fence:
    """Decide whether a heartbeat is news (CONTRACT.md section 2, ``seq`` and ``boot_id``).

    ``seq`` is strictly increasing within one boot id; a beat with an older or equal ``seq``
    for the current boot, or from a boot id seen before the current one, changes nothing.
    Any boot id never seen before is a new boot (boot ids are opaque, so "newer" can only
    mean "not seen before"). ``sent_at`` and arrival order play no part.

    Args:
        current_boot_id: the boot id of the last accepted beat, ``None`` if none yet.
        last_seq: ``seq`` of the last accepted beat (-1 if none).
        previous_boot_ids: boot ids accepted before the current one.
        boot_id, seq: the arriving beat's.
    """
    if boot_id == current_boot_id:
        return Fence.accept if seq > last_seq else Fence.stale_seq
    if boot_id in set(previous_boot_ids):
        return Fence.old_boot
    return Fence.new_boot


def remember_boot(previous: list[str], old_boot_id: str | None) -> list[str]:
    """The list of earlier boot ids after a new boot replaced ``old_boot_id`` (bounded)."""
    if old_boot_id is None:
        return previous
    return ([*previous, old_boot_id])[-MAX_REMEMBERED_BOOT_IDS:]


RANK = {state: m.clock for state, m in WORKERS.items() if m.clock is not None}
"""Order of the liveness states (``reaper.core.states``): the clock only moves a worker up
this order."""


def judge_liveness(
    last_heartbeat_at: datetime, now: datetime, stall_after: float, lost_after: float
) -> WorkerState:
    """The state a worker is in by the controller's clock alone.

    ``running`` until ``stall_after`` seconds without a heartbeat, ``stalled`` until
    ``lost_after``, then ``lost`` (CONTRACT.md section 1; Kubernetes: Ready, Unknown, evicted).
    """
    silent = (now - last_heartbeat_at).total_seconds()
    if silent >= lost_after:
        return WorkerState.lost
    if silent >= stall_after:
        return WorkerState.stalled
    return WorkerState.running


def next_deadline(
    last_heartbeat_at: datetime,
    state: WorkerState,
    stall_after: float,
    lost_after: float,
    grace_until: datetime | None = None,
) -> datetime | None:
    """When the liveness must next look at the clock, or ``None`` if it need not.

    ``running``: when it would stall; ``stalled``: when it would be lost, but never before
    ``grace_until`` (an outage or a fleet recovery grants every worker a fresh period);
    ``lost``: no deadline (only a heartbeat changes anything).
    """
    if state is WorkerState.running:
        return last_heartbeat_at + timedelta(seconds=stall_after)
    if state is WorkerState.stalled:
        due = last_heartbeat_at + timedelta(seconds=lost_after)
        if grace_until is not None and grace_until > due:
            return grace_until
        return due
    return None


def judged_late(deadline: datetime, now: datetime, heartbeat_interval: float) -> bool:
    """Whether a deadline (UTC) looked at ``now`` (UTC) was judged more than one heartbeat
    interval (seconds) late: the controller, or Temporal, was not watching when it fell due
    (a timer on time fires within ``liveness_clock.DEADLINE_SLACK_S`` of it)."""
    return (now - deadline).total_seconds() > heartbeat_interval


def outage_grace(
    deadline: datetime,
    now: datetime,
    heartbeat_interval: float,
    stall_after: float,
    spent: bool = False,
) -> datetime | None:
    """A grace end if a deadline timer fired so late that the controller was not watching.

    A timer that fires more than one heartbeat interval after its deadline means the
    controller (or Temporal) was down: the worker's silence is then no evidence, since its
    beats may have been refused. The worker gets ``stall_after`` seconds from now to beat
    again before it can be reaped (CONTRACT.md rule 8: a restart never reaps a live worker).
    Returns ``None`` when on time.

    One grace per disruption (``spent``): a grace already granted in this silence, with no
    look on time since, is not granted again. Consecutive late looks are one disruption, and
    the first gave the worker ``stall_after`` from a moment the server was up (a workflow
    task ran) to get a beat through. Without this, a controller whose tasks wait in the
    queue longer than a heartbeat interval judged every deadline late and postponed a dead
    worker's loss for as long as the waits lasted (issue 20, bench 7d at 10,000 workers:
    looks 100-280 s late). A fleet-wide outage that outlasts
    the grace is the disruption guard's (rule 6), as in Kubernetes' node lifecycle
    controller, which stops evicting when a whole zone goes NotReady.
    """
    if spent or not judged_late(deadline, now, heartbeat_interval):
        return None
    return now + timedelta(seconds=stall_after)


def transition(
    current: WorkerState,
    last_heartbeat_at: datetime,
    now: datetime,
    stall_after: float,
    lost_after: float,
    grace_until: datetime | None = None,
) -> WorkerState | None:
    """The liveness transition the clock calls for now, or ``None`` if none.

    The central decision of "when is a worker lost?": ``running`` -> ``stalled`` after
    ``stall_after`` seconds of silence, -> ``lost`` after ``lost_after`` (Kubernetes' node
    lifecycle: Ready -> Unknown -> evicted), never ``lost`` before ``grace_until`` (an outage
    of the controller or a fleet recovery granted a fresh period), and never backwards: only
    a heartbeat (:func:`is_return`) brings a worker back to ``running``.

    Args:
        current: the state the liveness holds.
        last_heartbeat_at: the last accepted beat (controller's clock, UTC).
        now: the controller's clock (UTC).
        stall_after, lost_after: ``REAPER_STALL_AFTER``, ``REAPER_LOST_AFTER`` in seconds.
        grace_until: no ``lost`` before this time (UTC), if set.
    """
    if current not in RANK:
        return None  # a state the clock does not judge (``reaper.core.states``: clock None)
    judged = judge_liveness(last_heartbeat_at, now, stall_after, lost_after)
    if judged is WorkerState.lost and grace_until is not None and now < grace_until:
        judged = WorkerState.stalled
    if RANK[judged] <= RANK[current]:
        return None
    return judged


def row_refresh_due(
    last_heartbeat_at: datetime,
    recorded_heartbeat_at: datetime | None,
    stall_after: float,
    heartbeat_interval: float,
) -> bool:
    """Whether the ``workers`` row's ``last_heartbeat_at`` and ``last_seq`` must be written
    again although nothing else about the worker changed.

    CONTRACT.md §5.3: the row may lag the liveness (its ``state`` query) by at most
    ``STALL_AFTER``. The liveness writes the refresh with a local activity in the workflow
    task that accepts the beat, and a query is answered between workflow tasks, so a reader
    sees a beat in the ``state`` query only once the row holds it, or holds a beat less than
    the threshold behind it: the lag a reader can see stays under the threshold, however late
    the beats come.

    It writes once the lag reaches ``STALL_AFTER - HEARTBEAT_INTERVAL / 2``, never less than
    half of ``STALL_AFTER`` (``refresh-at-bound``); half an interval is kept for a refresh
    that runs so long that the SDK heartbeats its workflow task (a query may then see the
    beat first). Every third beat at the contract's defaults (10 s and 30 s), every other one
    at ``STALL_AFTER`` of two intervals, where a refresh on every beat had halved the rate at
    which 1,000 workers registered (BENCHMARKS.md metric 4, issue 11).

    Args:
        last_heartbeat_at: the liveness's last accepted beat (UTC).
        recorded_heartbeat_at: the beat last written to the row (UTC), ``None`` if none was:
            a row not yet written is the state record's business, not a refresh.
        stall_after: ``REAPER_STALL_AFTER``, seconds.
        heartbeat_interval: ``REAPER_HEARTBEAT_INTERVAL``, seconds.
    """
    if recorded_heartbeat_at is None:
        return False
    lag = (last_heartbeat_at - recorded_heartbeat_at).total_seconds()
    return lag >= max(stall_after / 2, stall_after - heartbeat_interval / 2)


def is_return(
    current: WorkerState,
    last_heartbeat_at: datetime | None,
    now: datetime,
    stall_after: float,
    forced_reap_pending: bool,
) -> bool:
    """Whether an accepted heartbeat is the worker's return to ``running``.

    A return is a beat from a worker in a state a beat leaves (``states.WORKERS``:
    ``stalled``, ``lost``; not ``running``), or any beat after
    ``stall_after`` seconds of silence, even one the liveness was too busy to judge in time
    (same boundary as the deadline timer, so a replay decides alike). A return restarts
    every mark: reports taken before it never decide (rule 4). A forced reap that is still
    pending runs first: the worker stays ``lost`` until it is done, and its first beat after
    that is its return (an operator's reap is not undone by a beat in flight). A beat of a
    worker in a held state (one the clock does not judge and a beat does not leave,
    ``reaper.core.states``) is no return, however long its silence.

    Args:
        current: the state the liveness holds.
        last_heartbeat_at: the previous accepted beat (UTC), ``None`` for a first beat.
        now: the controller's clock at this beat (UTC).
        stall_after: ``REAPER_STALL_AFTER`` plus the timer slack, seconds.
        forced_reap_pending: an operator's ``force_reap`` is not done yet.
    """
    if forced_reap_pending:
        return False
    meaning = WORKERS[current]
    if meaning.left_by_a_beat:
        return True
    if meaning.clock is None:
        return False  # a held state: the clock never judged its silence, only a command ends it
    return (
        last_heartbeat_at is not None and (now - last_heartbeat_at).total_seconds() >= stall_after
    )


def clock_is_stale(now: datetime, deadline: datetime) -> bool:
    """Whether a deadline timer's fire is being applied on a clock that did not move.

    sdk-core advances ``workflow.now()`` only on a WorkflowTaskStarted event. When a worker
    takes a *legacy query task* (a ``state`` query sent while no workflow task was pending)
    whose history ends in events that arrived meanwhile (TimerFired, a signal) with no new
    WorkflowTaskStarted, core applies those events at the previous task's clock, keeps the
    run cached, and sends what the workflow decided there with the next real task; a replay,
    on the recorded clock, decides otherwise (nondeterminism, the liveness stuck). Such an
    activation shows when a deadline timer fired while ``now`` is before its ``deadline``:
    Temporal never fires a timer early, a real task starts after the fire, and the timer is
    due ``DEADLINE_SLACK_S`` after the deadline (that slack also absorbs the milliseconds a
    replay's clock may differ by). So a recorded history never trips this.

    (A rule on the history length, "a beat at the length where the loop already waited",
    also told such activations, but misfired on a live task after a reset, repeatedly: it
    is not kept. A stale activation with a beat and no fired timer is left to the repair.)

    Args:
        now: ``workflow.now()`` as the fire is applied (UTC).
        deadline: the deadline the fired timer was armed for (UTC).
    """
    return now < deadline
