"""Reports that queue in a busy collector: the newest supersedes the older ones queued, and
is still acted on.

The liveness seals each report it forwards (``activities.sealing``); when a report reaches
the collector while an older one of its kind waits there, the newer takes the older's place
and carries the handles only the older held, whose clocks restart (rule 4). Until
2026-12-05 the collector wrote those into the newer report's sealed ``also_seen``, so the
seal no longer matched, the report was refused ("bad seal"), and the liveness, which had
forwarded it, did not send it again before ``FULL_RESYNC_INTERVAL``: a placed task stayed
pending and an absent one running (the chaos smoke, seed 8, rule 8).
"""

from __future__ import annotations

from tests.support.polling import eventually
from tests.support.scheduler import insert


async def missing_since(pool, handle: str):
    return await pool.fetchval(
        "SELECT missing_since FROM reaper.containers WHERE handle = $1", handle
    )


async def test_a_report_that_superseded_a_queued_one_is_reconciled_not_refused(fleet):
    w = fleet.name("w")
    await insert(fleet.pool, "containers", w, ["c-1", "c-2", "c-3"])
    await fleet.beat(w, containers=["c-1", "c-2", "c-3"], volumes=[], tasks=[])
    await fleet.settle(w)
    base = (await fleet.state(w)).forwarded_reports
    async with fleet.pool.acquire() as conn, conn.transaction():
        # The collector's reconcile of A waits on the table; B, then C, queue behind it.
        await conn.execute("LOCK TABLE reaper.containers IN ACCESS EXCLUSIVE MODE")
        for lists in (["c-1", "c-2"], ["c-1", "c-3"], ["c-1"]):
            fleet.seq[w] += 1
            await fleet.took(
                w,
                {
                    "worker": w,
                    "boot_id": fleet.boot[w],
                    "seq": fleet.seq[w],
                    "sent_at": "2026-11-30T10:00:00Z",
                    "containers": lists,
                    "volumes": [],
                    "tasks": [],
                },
            )
        await eventually(
            lambda: fleet.state(w),
            lambda s: s.forwarded_reports >= base + 3,
            what="three reports forwarded while the collector waits",
        )
    await fleet.settle(w)
    # A marked c-3; C (in B's place, B's c-3 carried) marked c-2 and restarted c-3's clock.
    c2 = await missing_since(fleet.pool, "c-2")
    assert c2 is not None, "the newest report was refused"
    assert await missing_since(fleet.pool, "c-3") == c2  # B saw it after A's mark: restarted
    assert await missing_since(fleet.pool, "c-1") is None
