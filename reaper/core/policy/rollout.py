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

RELEASE_LINES: tuple[str, ...] = ("1.1", "1.2")
"""Release lines (``major.minor``) that may serve one task queue with this code, in order:
the previous line and this code's own (the last). A release takes over only from the release
before it (CHANGELOG.md, "Upgrade"), so the lines before the previous one are gone: 1.2
retired 1.0's branches of every 1.1 change (``rearm-on-beat``, ``wide-staging``,
``drop-superseded-chunks``, ``one-task-start``, ``one-grace``, ``in-task-loss``,
``drain-in-order``), which every run now takes."""

DEFAULT_PEER_VERSION = "1.1"
"""The oldest line that may serve beside this code unless an operator says otherwise: the
previous line, so a rolling upgrade from it is safe with nothing set. Also what a start-up
read that carries no peer version counts as."""

ROTATING_HOSTS = "rotating-hosts"
"""Contract v1.2 (§6): a ``drain`` may migrate the worker's tasks (``migrate``, a deadline),
a drained worker shows ``drained`` in the ``state`` query and ``ReaperState``, and
``force_reap``, ``drain``, ``undrain`` and ``retire`` are Temporal Updates that answer. A
liveness of the 1.1 line has no update handlers and never shows ``drained``: a history with
an accepted update or a ``drained`` upsert would not replay on it. The fleet monitor of a
run at this line may be woken early (signal ``upkeep``: a cancelled timer) and continues as
new only after a wait, where 1.1's never is and does so before it."""

COMMAND_CHANGES: dict[str, str] = {ROTATING_HOSTS: "1.2"}
"""Each change that a controller of an older line could not serve beside (a workflow's
commands, or what an activity's input asks) and the line that introduced it."""


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


def in_use(peer_version: str) -> list[str]:
    """Every command change of :data:`COMMAND_CHANGES` a run may use beside controllers of
    at least ``peer_version`` (:func:`uses`), in declaration order."""
    return [change for change in COMMAND_CHANGES if uses(change, peer_version)]
