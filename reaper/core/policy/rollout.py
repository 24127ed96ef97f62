"""Which workflow command changes a controller may use, given the oldest release that may
serve its task queue beside it (``REAPER_PEER_VERSION``).

A liveness decides its features once at the start of each run, from what its start-up read
recorded in history (the peer version among its timings), so a replay decides the same
whatever the controller's settings are today. A change that gives a workflow commands an
older release would not give on the same history (a release's code replays every history
that reaches it, CHANGELOG.md "The upgrade promise") is used only once every peer knows it:
during a rolling upgrade from release N-1 both releases serve the same task queue, and a
workflow task of a new run may reach either. Kafka's ``inter.broker.protocol.version`` is the
same rule for brokers; Kubernetes' feature gates turn a changed behaviour on by default only
in the release after the one that understands it.

Pure: no I/O, no Temporal.
"""

from __future__ import annotations

RELEASE_LINES: tuple[str, ...] = ("1.0", "1.1")
"""Release lines (``major.minor``) in order; a controller of a line replays the histories of
the lines before it. The last is this code's own line."""

DEFAULT_PEER_VERSION = "1.0"
"""The oldest line that may serve beside this code unless an operator says otherwise: the
previous line, so a rolling upgrade from it is safe with nothing set. Also what a history
recorded before the setting existed implies (its timings carry no peer version)."""

REARM_ON_BEAT = "rearm-on-beat"
"""Re-arm a healthy worker's deadline timer in a beat's own workflow task, before it fires
(``liveness_clock.rearm_due``): a ``TimerCanceled`` and a ``TimerStarted`` every other beat
at the defaults instead of a workflow task of its own every STALL_AFTER (issue 20)."""

WIDE_STAGING = "wide-staging"
"""Stage up to 16 chunks of a large report at once instead of 4
(``workflows.staging.STAGE_PARALLEL_WIDE``): a 100,000-handle report's 52 chunks in 4 rounds
of activities instead of 13 (issue 20, metric 3b)."""

DROP_SUPERSEDED_CHUNKS = "drop-superseded-chunks"
"""Stage only the newest report's chunks of each kind; queued chunks of older reports are
dropped unstaged and the newest report restarts every mark of its kind
(``policy.collection.superseded_chunks``): a backlog of large reports no longer stages
every chunk into history a second time (breaker finding, 2026-12-04)."""

ONE_GRACE = "one-grace"
"""One outage grace per disruption: a late look in a silence whose grace was already granted,
with no look on time since, grants no other (``policy.liveness.outage_grace``), so a
controller whose tasks wait in the queue longer than a heartbeat interval no longer
postpones a dead worker's loss for as long as the waits last (issue 20, bench 7d). A run
that takes it declares ``lost`` where an older release would arm another grace timer."""

IN_TASK_LOSS = "in-task-loss"
"""A loss is written in the workflow task that judges it, and a reap's transaction in its
child's first task: the ``lost`` record, the fleet check before a reap and ``reap_worker``
run as local activities where the previous line scheduled activities. Two trips through
the activity queue and one through the workflow task queue fewer between a silent worker's
deadline and its replacement, which is what a busy controller makes late (issue 20, bench
4d and 4e). Recorded by a patch marker too, so a run of this line recorded before it keeps
its commands in replay."""

ONE_TASK_START = "one-task-start"
"""Register a new worker in the first workflow task of its liveness: the start-up read
(``begin_liveness``) as a local activity, so the ``running`` row is written in the same task
instead of a second one after an activity (issue 20, BENCHMARKS.md proposal 1: 16 history
events to 11 per registration, one trip through the task queue instead of two). A first run
has no start-up read of its own to record a peer version in yet, so it is decided from the
controller's own setting (:data:`PEER_VERSION_EXTERN`) and recorded by a patch marker."""

ONE_TASK_START_ON = True
"""Whether a controller takes :data:`ONE_TASK_START` at all (when its peer version allows
it): the switch that turns it off without a release, should a first task that holds its
Postgres reads prove costly. While that task is in flight the server holds one query of the
worker (``history.MaxBufferedQueryCount``) and asks other readers to try again, and more
than 2 MB of signals behind it make the server fail the task once to write them
(``FORCE_CLOSE_COMMAND``; the task runs again, its local activities idempotent). Replays of
runs that took it (the marker) work either way."""

DRAIN_IN_ORDER = "drain-in-order"
"""Apply every drain and undrain request that reached a liveness together, in order, with an
``events`` row each (``policy.drain``), where the previous line applied only the newest.
Not a change of commands (still one ``set_draining``) but of what that activity's input asks:
a retry of a batch whose first attempt a previous-line controller ran (the newest alone, no
dedupe key) would find the row moved and write rows that never happened, so the batch is
sent only once every peer knows it (breaker finding, 2026-12-07)."""

COMMAND_CHANGES: dict[str, str] = {
    REARM_ON_BEAT: "1.1",
    WIDE_STAGING: "1.1",
    DROP_SUPERSEDED_CHUNKS: "1.1",
    ONE_TASK_START: "1.1",
    ONE_GRACE: "1.1",
    IN_TASK_LOSS: "1.1",
    DRAIN_IN_ORDER: "1.1",
}
"""Each change that a controller of an older line could not serve beside (a workflow's
commands; for ``drain-in-order``, what an activity's input asks) and the line that
introduced it."""


PEER_VERSION_EXTERN = "reaper_peer_version"
"""Name of the function (no arguments, returns this controller's ``REAPER_PEER_VERSION``)
that a controller gives its workflows (``reaper.infra.temporal.PeerVersionGate``). Workflow
code asks it only outside replay, for a decision it records (a patch marker); a worker
without it (the SDK's ``Replayer``) counts as :data:`DEFAULT_PEER_VERSION`."""


def known_line(version: str) -> bool:
    """Whether ``version`` (``major.minor``) is a line of :data:`RELEASE_LINES`."""
    return version in RELEASE_LINES


def uses(change: str, peer_version: str) -> bool:
    """Whether a run may use command change ``change`` when every controller that may serve
    its task queue is at least ``peer_version`` (a line of :data:`RELEASE_LINES`; an
    unknown one counts as the oldest).

    Raises:
        KeyError: ``change`` is not in :data:`COMMAND_CHANGES`.
    """
    since = RELEASE_LINES.index(COMMAND_CHANGES[change])
    peer = RELEASE_LINES.index(peer_version) if known_line(peer_version) else 0
    return peer >= since
