"""What a workflow shows of itself: the liveness's ``state`` query answer (CONTRACT.md §2) and
the current details of the liveness and its collector (the Web UI's "Current Details").

Current details are workflow metadata, read through the SDK's ``__temporal_workflow_metadata``
query: setting them writes no history event, so they may change at any activation. They are
rebuilt only when a fact in them changed.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from datetime import datetime

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from reaper.core import states
    from reaper.core.contract import KINDS, StateView
    from reaper.core.liveness_state import LivenessState
    from reaper.core.models import CollectorState, DeadlinesView, Timings
    from reaper.core.policy import collection
    from reaper.core.policy.liveness_clock import silence_deadline
    from reaper.core.policy.liveness_machine import shown_values
    from reaper.core.policy.reports import liveness_only
    from workflows.common import MISSING_ATTR, STATE_ATTR, WORKER_ATTR, collector_id


def state_view(live: LivenessState, backlog: int) -> StateView:
    """What the ``state`` query returns for ``live``; ``backlog`` is the intake's count of
    complete reports not yet handed to the collector."""
    missing = {k: st.missing for k, st in live.collected.items()}
    return StateView(
        worker=live.worker,
        state=live.state.value,
        boot_id=live.boot_id,
        last_seq=live.last_seq if live.last_seq >= 0 else None,
        last_heartbeat_at=live.last_heartbeat_at,
        missing=sum(missing.values()),
        assignments=list(live.assignments),
        orphans=sorted({h for st in live.collected.values() for h in st.orphans}),
        draining=live.draining,
        state_since=live.state_since,
        rejected=live.rejected,
        last_rejection=live.last_rejection,
        ignored=live.ignored,
        missing_by_kind=missing,
        pending_reports=backlog,
        orphans_by_kind={k: list(st.orphans) for k, st in live.collected.items() if st.orphans},
        report_digests={
            k: r.digest for k in KINDS if (r := live.unforwarded.get(k) or live.last_reports.get(k))
        },
        forwarded_reports=live.forwarded,
        drained=live.draining and live.drained_at is not None,
    )


def deadlines_view(live: LivenessState) -> DeadlinesView:
    """What the ``deadlines`` query returns for ``live``: the controller's own prediction of
    its worker's clock, for ``reaper explain``."""
    loaded = live.timings is not None
    return DeadlinesView(
        state=live.state.value,
        next_deadline=silence_deadline(live) if loaded else None,
        grace_until=live.grace_until,
        timings=live.timings,
    )


class CurrentDetails:
    """A workflow's current details, set again only when the facts they show changed."""

    def __init__(self) -> None:
        self.facts: Hashable | None = None

    def show(self, facts: Hashable, build: Callable[[], str]) -> None:
        """Set the details to ``build()`` unless ``facts`` equal those last shown."""
        if facts == self.facts:
            return
        self.facts = facts
        workflow.set_current_details(build())


def utc(at: datetime | None) -> str:
    """``at`` as ``2026-12-01 18:34:27 UTC``; ``never`` for ``None``."""
    return at.strftime("%Y-%m-%d %H:%M:%S UTC") if at is not None else "never"


def liveness_facts(live: LivenessState) -> Hashable:
    """Everything :func:`liveness_details` shows (compared to skip an unchanged rebuild)."""
    return (
        live.state,
        live.state_since,
        live.last_heartbeat_at,
        live.last_seq,
        live.boot_id,
        live.draining,
        live.drain_reason,
        tuple((k, st.missing, len(st.orphans)) for k, st in sorted(live.collected.items())),
        tuple(sorted(live.complete_at.items())),
        live.timings is not None,
    )


def reports_line(live: LivenessState, t: Timings) -> str | None:
    """``- **reports**: complete`` or ``... liveness only since <UTC> (kinds)``, as
    ``policy.reports.liveness_only`` judges the liveness's own times; ``None`` for a worker
    whose reports do not decide (stalled, lost: it is silent, not liveness only)."""
    if live.last_heartbeat_at is None or not states.worker(live.state).decides:
        return None
    verdict = liveness_only(
        live.state.value, live.last_heartbeat_at, live.complete_at, t.resync_interval
    )
    if verdict is None:
        return "- **reports**: complete"
    since = f"since {utc(verdict.since)}" if verdict.since else "(no complete report yet)"
    return f"- **reports**: liveness only {since} ({', '.join(verdict.kinds)})"


def liveness_details(live: LivenessState, gc_id: str) -> str:
    """The liveness's current details (Markdown): worker, state, last heartbeat (UTC), missing
    and orphan counts, draining, boot id, and the timings it judges by."""
    missing = {k: st.missing for k, st in sorted(live.collected.items()) if st.missing}
    orphans = {h for st in live.collected.values() for h in st.orphans}
    by_kind = ", ".join(f"{k} {n}" for k, n in missing.items())
    seq = f" (seq {live.last_seq})" if live.last_seq >= 0 else ""
    draining = f"yes: {live.drain_reason}" if live.draining else "no"
    facts = [
        f"- **worker**: {live.worker}",
        f"- **state**: {live.state.value} since {utc(live.state_since)}",
        f"- **last heartbeat**: {utc(live.last_heartbeat_at)}{seq}",
        f"- **missing**: {sum(missing.values())}" + (f" ({by_kind})" if by_kind else ""),
        f"- **orphans**: {len(orphans)}",
        f"- **draining**: {draining}",
        f"- **boot id**: {live.boot_id or 'none yet'}",
    ]
    t = live.timings
    if t is None:
        return "\n".join(facts)
    reports = reports_line(live, t)
    facts += [reports] if reports else []
    rule = (
        f"Stalled after {t.stall_after:g}s and lost after {t.lost_after:g}s without a "
        f"heartbeat; handle GC in `{gc_id}`."
    )
    return "\n".join(facts) + "\n\n" + rule


def collector_details(worker: str, t: Timings, gc: CollectorState) -> str:
    """The collector's current details (Markdown): per kind, what is missing and when the
    oldest falls due, orphans, and reports held back as mass drops."""
    dry = " (dry run: nothing is changed)" if t.dry_run else ""
    waits = ", ".join(
        f"{kind} {collection.destroy_after(kind, t.missing_ttl):g}s" for kind in KINDS
    )
    head = (
        f"Handle GC of worker **{worker}**: a handle absent from every complete report for "
        f"as long as its kind waits ({waits}) is destroyed{dry}."
    )
    lines = []
    for kind in KINDS:
        sent = gc.sent.get(kind)
        if sent is None:
            continue
        st = sent.status
        due = f", the first due at {utc(st.next_due)}" if st.missing and st.next_due else ""
        held = "; a mass drop held back until confirmed" if kind in gc.suspects else ""
        lines.append(f"- **{kind}**: {st.missing} missing{due}; {len(st.orphans)} orphans{held}")
    return "\n\n".join([head, "\n".join(lines)]) if lines else head


class LivenessView:
    """What a liveness shows of itself in the Web UI: its current details, and its search
    attributes (CONTRACT.md §2), upserted only when their values change.

    Args:
        live: the liveness's state (read only).
    """

    def __init__(self, live: LivenessState) -> None:
        self.live = live
        self.details = CurrentDetails()

    def show_details(self) -> None:
        """Keep the Web UI's current details live (no history event; rebuilt on a change)."""
        live = self.live
        self.details.show(
            liveness_facts(live), lambda: liveness_details(live, collector_id(live.worker))
        )

    def show(self) -> None:
        """Show the state: current details, and the search attributes when they changed
        (CONTRACT.md §2; ``liveness_machine.shown_values``)."""
        self.show_details()
        values = shown_values(self.live)
        if values == self.live.shown:
            return
        self.live.shown = values
        workflow.upsert_search_attributes(
            [
                WORKER_ATTR.value_set(self.live.worker),
                STATE_ATTR.value_set(values[0]),
                MISSING_ATTR.value_set(values[1]),
            ]
        )
