"""The campaign's own log: what each agent sent and when, what the scheduler inserted, which
faults were active when. The checker judges the controller against this, not against what
the controller wrote about itself.

Times are Unix seconds (``time.time()``), the clock the Temporal server and Postgres read
too (one host).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Beat:
    """One heartbeat an agent sent (CONTRACT.md §2)."""

    worker: str
    boot: str
    seq: int
    sent: float
    """When the send began: the server cannot have recorded it earlier."""
    acked: float | None
    """When the server acknowledged it (recorded in the liveness's history by then);
    ``None`` when the call failed or timed out: it may or may not have been delivered."""
    reports: Mapping[str, frozenset[str]]
    """Complete lists per kind (``containers``, ``volumes``, ``tasks``)."""


@dataclass
class Window:
    """A stretch of time something held: a fault, or an agent's silence."""

    what: str
    start: float
    end: float | None = None
    """``None`` while it lasts."""

    def overlaps(self, t0: float, t1: float) -> bool:
        end = self.end if self.end is not None else float("inf")
        return self.start <= t1 and end >= t0


@dataclass(frozen=True)
class Insert:
    """A row the stand-in scheduler inserted (CONTRACT.md §3)."""

    kind: str
    worker: str
    created: float
    """When it became ``created`` (inserted so, or updated from ``creating``): no report
    taken before this marks it (rule 2), so nothing destroys it before ``created + TTL``."""
    held: bool
    """Whether the agent holds it (a row it never held is due after the TTL)."""


@dataclass(frozen=True)
class Command:
    """One attempt to deliver an operator command to a worker's liveness: ``drain``,
    ``undrain``, or ``rotate`` (the ``drain`` update with ``migrate`` and ``deadline``,
    CONTRACT.md §6.1)."""

    what: str
    sent: float
    """When the attempt began: the liveness cannot have taken it earlier (an attempt that
    failed may still have been delivered)."""
    deadline: float | None = None
    """A rotation's deadline, seconds: counted by the controller from when it applies the
    drain, so no sooner than ``sent + deadline``."""


@dataclass
class Ledger:
    """Everything the campaign did, appended as it happens."""

    beats: dict[str, list[Beat]] = field(default_factory=dict)
    faults: list[Window] = field(default_factory=list)
    silences: dict[str, list[Window]] = field(default_factory=dict)
    """Per worker: when its agent sent nothing on purpose (silent, dead, retired)."""
    retires: dict[str, list[float]] = field(default_factory=dict)
    """Per worker: when a ``retire`` signal was sent (delivered or not)."""
    inserts: dict[str, Insert] = field(default_factory=dict)
    """Per handle (or task id): what the scheduler inserted."""
    commands: dict[str, list[Command]] = field(default_factory=dict)
    """Per worker: every attempt to drain, undrain or rotate it."""
    kills: int = 0
    """SIGKILLs of a controller replica or the Temporal server, crash stops of Postgres."""
    counts: dict[str, int] = field(default_factory=dict)
    """Actions and faults done, by name (for the summary)."""

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def beat(self, b: Beat) -> None:
        self.beats.setdefault(b.worker, []).append(b)

    def fault(self, what: str, start: float) -> Window:
        w = Window(what, start)
        self.faults.append(w)
        return w

    def command(self, worker: str, c: Command) -> None:
        self.commands.setdefault(worker, []).append(c)

    def sent(self, worker: str, what: str) -> list[Command]:
        """The attempts of ``what`` (``drain``, ``undrain``, ``rotate``) for ``worker``."""
        return [c for c in self.commands.get(worker, []) if c.what == what]

    def silence(self, worker: str, start: float) -> Window:
        w = Window("silent", start)
        self.silences.setdefault(worker, []).append(w)
        return w

    def silent_between(self, worker: str, t0: float, t1: float) -> bool:
        """Whether the agent went quiet on purpose at any time in ``[t0, t1]``."""
        return any(w.overlaps(t0, t1) for w in self.silences.get(worker, []))

    def outages(self, prefix: str) -> list[Window]:
        """Fault windows whose name starts with ``prefix`` (``temporal-down``, ...)."""
        return [w for w in self.faults if w.what.startswith(prefix)]

    def last_fault_end(self) -> float:
        ends = [w.end for w in self.faults if w.end is not None]
        return max(ends, default=0.0)

    def faults_active(self) -> bool:
        return any(w.end is None for w in self.faults)
