"""A campaign's last lines (chaos/campaign.py): what the ledger counted, the destroys and
reaps by reason, the host rotations (CONTRACT.md §6, at a peer version that rotates), what
the histories held, the checker's reads, every violation, and the line that counts them
(``chaos: N rounds, ...``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from chaos.histories import Scan
from chaos.ledger import Ledger
from chaos.observe import Observations
from chaos.rotation_checks import MIGRATION
from chaos.rules import Violation
from reaper.core.policy import rollout


def summarize(
    say: Callable[[str], None],
    rounds: int,
    peer_version: str,
    ledger: Ledger,
    obs: Observations,
    violations: list[Violation],
    scan: Scan | None,
) -> int:
    """Print the summary (``say`` each line, then every violation and the count); returns the
    exit status (1 when a rule was broken)."""
    events = list(obs.events.values())
    destroys = Counter(
        e.reason.split(":")[0]
        for e in events
        if e.action in ("destroyed", "stopped") and not e.reason.startswith(MIGRATION)
    )
    reaps = Counter(e.reason.split(":")[0].split(" for")[0] for e in events if e.action == "lost")
    d, p, v = sum(destroys.values()), sum(reaps.values()), len(violations)
    counts = ", ".join(f"{k} {n}" for k, n in sorted(ledger.counts.items()))
    say(f"done: {counts}")
    say(f"destroys by reason {dict(destroys)}; reaps by reason {dict(reaps)}")
    if rollout.uses(rollout.ROTATING_HOSTS, peer_version):
        say(rotations(ledger.counts, events))
    if scan is not None:
        say(
            f"histories: {scan.runs} runs read; task failures of the server's own "
            f"(not counted): {dict(scan.server_causes) or 'none'}"
        )
    beats = [b for bs in ledger.beats.values() for b in bs]
    acked = sum(1 for b in beats if b.acked is not None)
    say(
        f"checker: {obs.reads} reads ({obs.failed_reads} failed: Postgres down or "
        f"a table locked), {len(events)} events; {len(beats)} beats sent, {acked} "
        f"acknowledged"
    )
    for violation in violations:
        print(violation, flush=True)
    print(
        f"chaos: {rounds} rounds, {ledger.kills} kills, {d} destroys, {p} reaps, {v} violations",
        flush=True,
    )
    return 1 if v else 0


def rotations(counts: dict[str, int], events: list[Any]) -> str:
    """The summary line of the host rotations (CONTRACT.md §6): the rotations done of
    those drawn (a draw finds no host when none runs tasks), the counts of their answers and
    follow-ups, and what the ``events`` rows say was done."""
    asked = {k: n for k, n in sorted(counts.items()) if k.startswith("rotate")}
    stops = Counter(
        e.reason.split(":")[0]
        for e in events
        if e.action == "stopped" and e.reason.startswith(MIGRATION)
    )
    placed = sum(1 for e in events if e.action == "replaced" and e.reason.startswith("migrate"))
    drained = sum(1 for e in events if e.action == "drained")
    done, skipped = counts.get("rotate", 0), counts.get("rotate-skipped", 0)
    return (
        f"rotations: {done} of {done + skipped} drawn ({asked}); {placed} replacements "
        f"placed by migration, tasks stopped {dict(stops)}, {drained} workers drained"
    )
