"""Results of the bench: one line per metric as it is measured, and the final table."""

from __future__ import annotations

from dataclasses import dataclass, field

METRICS: tuple[tuple[str, str], ...] = (
    ("1", "heartbeat throughput"),
    ("1b", "heartbeat throughput, 50-handle reports"),
    ("1s", "signed heartbeat throughput"),
    ("2", "writes per unchanged report"),
    ("3a", "big report: reconcile DB time"),
    ("3b", "big report: end to end"),
    ("4a", "lost after last beat"),
    ("4b", "replacement after last beat"),
    ("4c", "workflow-task queue wait"),
    ("4d", "lost after last beat, CPU hog beside"),
    ("4e", "replacement after last beat, CPU hog beside"),
    ("5a", "history per heartbeat"),
    ("5b", "longest liveness run"),
    ("6", "controller memory"),
    ("7a", "scale: registration"),
    ("7b", "scale: false stalls"),
    ("7c", "scale: replica memory"),
    ("7d", "scale: lost after last beat"),
    ("8a", "registration: server cost"),
    ("8b", "registration rate"),
    ("9", "steady beat: server cost"),
    ("10a", "rotation, max_surge 1"),
    ("10b", "rotation, max_surge 5"),
)
"""Every metric the bench prints, in order: ``[id] name: ...`` (tests check each is there).
The 7s run in ``--quick`` and, at full size (25 to 35 minutes with its floor), only with
``--scale``."""
SCALE = frozenset({"7a", "7b", "7c", "7d"})

NAMES = dict(METRICS)


@dataclass
class Metric:
    """One measured metric: ``value`` is what was measured, ``verdict`` PASS, MISS or INFO."""

    key: str
    value: str
    target: str
    verdict: str
    details: list[str] = field(default_factory=list)
    """Further measured facts (breakdowns, counts), printed under the line."""
    why: str = ""
    """For a MISS (or an n/a): the measured reason."""

    @property
    def name(self) -> str:
        return NAMES[self.key]

    def line(self) -> str:
        return f"[{self.key}] {self.name}: {self.value} (target {self.target}) {self.verdict}"


def verdict(ok: bool | None) -> str:
    return "INFO" if ok is None else ("PASS" if ok else "MISS")


def table(metrics: list[Metric]) -> str:
    """A fixed-width table: metric, measured, target, verdict."""
    rows = [("metric", "measured", "target", "result")]
    rows += [(f"{m.key} {m.name}", m.value, m.target, m.verdict) for m in metrics]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    out = []
    for i, r in enumerate(rows):
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def markdown_table(metrics: list[Metric]) -> str:
    rows = ["| metric | measured | target | result |", "|---|---|---|---|"]
    for m in metrics:
        rows.append(f"| {m.key} {m.name} | {m.value} | {m.target} | {m.verdict} |")
    return "\n".join(rows)
