"""The liveness's ``state`` query answer (CONTRACT.md §2), built from its state."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from reaper.core.contract import KINDS, StateView
    from reaper.core.models import LivenessState


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
    )
