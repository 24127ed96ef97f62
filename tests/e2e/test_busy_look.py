"""A look made late by the controller's own queue grants no outage grace (issue 36,
``watched-grace``): Temporal stayed up, fired the dead worker's timers on time and accepted
every other worker's beats, so the dead worker's silence is evidence and it is lost at the
late look itself. A controller restart still grants the grace
(tests/e2e/test_outage.py).

The busy host is the extreme one: the controller process is stopped (SIGSTOP) past the dead
worker's lost deadline and continued, on the same connection; the others beat throughout
and their beats, queued in Temporal, are applied before their timers. Real processes: the
controller is ``python worker.py``, Temporal the session's dev server."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import timedelta

from tests.e2e.test_outage import (
    FAST,
    HEARTBEAT_S,
    LOST_AFTER_S,
    STALL_AFTER_S,
    Agents,
    evidence,
    logged,
    others_run_and_record,
    register_fleet,
    running_fleet,
    tolerant,
)
from tests.support.controller import ControllerProcess
from tests.support.heartbeats import query_state
from tests.support.polling import eventually


async def test_a_look_late_only_for_the_controllers_queue_grants_no_grace(
    dev_env, db_url, pool, tmp_path
):
    client = dev_env.client
    ctl = ControllerProcess(
        client.service_client.config.target_host,
        db_url,
        tmp_path / "controller.log",
        FAST,  # at peer version 1.2: watched-grace
    )
    reports = await register_fleet(pool)
    dead = list(reports)[-1]
    ctl.start()
    try:
        async with Agents(client, ctl.task_queue, reports) as agents:
            await running_fleet(pool, client, list(reports))
            await agents.pause(dead)  # its agent never beats again
            last = await eventually(
                lambda: tolerant(lambda: query_state(client, dead), timeout=1.0),
                lambda s: s is not None and s.last_heartbeat_at is not None,
                timeout=30,
                what=f"{dead}'s last beat handled",
            )
            assert last is not None and last.last_heartbeat_at is not None
            ctl.pause()  # the busy host: nothing of the controller runs
            stopped = time.monotonic()
            await asyncio.sleep(LOST_AFTER_S + 3 * HEARTBEAT_S)  # past the lost deadline
            ctl.resume()
            paused = time.monotonic() - stopped
            found = await logged(
                ctl,
                rf"{dead}: deadline judged ([\d.]+)s late, but the controller reached"
                rf" Temporal and Postgres for ([\d.]+)s without a break",
            )
            st = await eventually(
                lambda: tolerant(lambda: query_state(client, dead), timeout=1.0),
                lambda s: s is not None and s.state == "lost",
                timeout=60,
                what=f"{dead} lost",
            )
            assert st is not None and st.state_since is not None
            notes = (
                f"paused {paused:.1f}s; judged {found[1]}s late, watched {found[2]}s;"
                f" lost at {st.state_since}{await evidence(pool, ctl)}"
            )
            log = ctl.log.read_text(errors="replace")
            assert not re.search(rf"{dead}: deadline judged [\d.]+s late: grace", log), notes
            # Lost at the late look itself (the same workflow task), not STALL_AFTER after
            # it: the look judged the last beat's stall deadline this late, or its lost
            # deadline if the stall was judged on time before the pause.
            looks = [
                last.last_heartbeat_at + timedelta(seconds=after + float(found[1]))
                for after in (STALL_AFTER_S, LOST_AFTER_S)
            ]
            assert min(abs((st.state_since - at).total_seconds()) for at in looks) < 0.01, notes
            await others_run_and_record(client, reports, dead, notes, "liveness-watched-grace")
    finally:
        ctl.stop()
