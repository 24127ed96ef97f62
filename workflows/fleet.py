"""``FleetMonitor``: the fleet as a whole (``reaper-fleet``), one per namespace.

Every heartbeat interval it re-reads the fleet's disruption state (computed in Postgres
whenever a worker changes state, ``activities/fleet.py`` ``refresh_fleet``) and shows it as
the workflow's current details and memo and in the ``fleet`` query; and it runs the fleet's
upkeep: owed replacements placed on workers that became available (§5.1), stray tasks on
lost or retired workers reaped; the workers that received work are told at once; and the
change feed read: each worker whose rows changed is asked for a diff (activities/changes.py);
and stuck livenesses repaired (activities/repair.py), concurrently with the checks, so a
slow repair (replays of a long history) never delays owed work. A migration's next step
wakes it before the interval ends (signal ``upkeep``, at peer version 1.2).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities import ReaperActivities
    from activities.types import FleetView, RepairResult
    from reaper.core.models import Timings
    from reaper.core.policy import rollout
    from workflows import front_door
    from workflows.common import (
        ACTIVITY_TIMEOUT,
        CHANGE_FEED,
        REPAIR_STUCK,
        RETRY,
        run_activity,
        should_continue_as_new,
        tell_placed,
    )
    from workflows.view import utc

REPAIR_TIMEOUT = timedelta(minutes=2)
"""``start_to_close`` of ``repair_stuck``: its replays of a long history take seconds each
(``activities/repair.py`` stops starting new ones after 30 s)."""
REPAIR_HEARTBEAT = timedelta(seconds=20)
"""Its heartbeat timeout (it beats every 5 s): a controller that dies mid-repair is noticed
this soon, and the repair retried (rule 8's 30 s)."""
REPAIR_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=3,
)
"""Unlike every other activity, a repair is not retried for ever: the next check starts
another one anyway, and the monitor must never wait for ever on one that cannot succeed
(it waits for the running one before it continues as new)."""


async def finish_repair(repair: workflow.ActivityHandle[RepairResult]) -> None:
    """Wait for a repair (at once if done); a failure after its retries is logged only: the
    next check repairs again."""
    try:
        await repair
    except ActivityError as exc:
        workflow.logger.warning("repair of stuck livenesses failed: %s", exc.cause or exc)


def fleet_details(view: FleetView, timings: Timings, placed: int) -> str:
    """The fleet monitor's current details (Markdown): the disruption state with its counts,
    since when, and what the last check did."""
    total = view.healthy + view.unhealthy
    since = f" since {utc(view.since)}" if view.since else ""
    return (
        f"Fleet disruption: **{view.state}**{since}: {view.unhealthy} of {total} workers "
        f"unhealthy (threshold {timings.disruption_threshold:g}). In `full`, nothing is "
        "reaped or destroyed automatically.\n\n"
        f"Last check {utc(workflow.now())} (every {timings.heartbeat_interval:g}s): "
        f"{placed} tasks placed (owed replacements, and replacements of strays)."
    )


@workflow.defn(name="FleetMonitor")
class FleetMonitor:
    """Shows ``normal``/``partial``/``full`` disruption with counts; query ``fleet``."""

    @workflow.init
    def __init__(self, *args: Any) -> None:
        self.view: FleetView | None = None
        self.timings = front_door.start_input(Timings.model_validate, args)
        """The controller's timings; ``None`` if the start input did not parse (``run`` then
        reads the settings of the controller that runs it)."""
        self.upkeep_due = False
        """A migration's next step is due (signal ``upkeep``): check now, not at the tick."""

    @workflow.query(name="fleet")
    def fleet(self, *args: Any) -> FleetView | None:
        """The fleet's disruption state with its counts, as last read."""
        return self.view

    @workflow.signal(name="upkeep")
    def upkeep(self, *args: Any) -> None:
        """Run the checks now (``activities.changes.wake_upkeep``, an internal name); any
        arguments are ignored. A run of the 1.1 line's peers only notes it (:meth:`run`)."""
        self.upkeep_due = True

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """Any other signal is ignored, logged and counted."""
        front_door.unknown_signal(name, len(args))

    @workflow.run
    async def run(self, *args: Any) -> None:
        """The checks, every heartbeat interval; ``args``: the start input (``Timings``),
        parsed once in ``__init__``."""
        timings = self.timings
        if timings is None:
            timings = await workflow.execute_activity_method(
                ReaperActivities.load_timings,
                start_to_close_timeout=ACTIVITY_TIMEOUT,
                retry_policy=RETRY,
                summary="read the controller's settings",
            )
        repair: workflow.ActivityHandle[RepairResult] | None = None
        while True:
            view = await run_activity(
                ReaperActivities.fleet_status, workflow.now(), summary="read fleet disruption state"
            )
            if self.view is None or (view.state, view.healthy, view.unhealthy) != (
                self.view.state,
                self.view.healthy,
                self.view.unhealthy,
            ):
                workflow.upsert_memo(
                    {
                        "fleet_state": view.state,
                        "healthy": view.healthy,
                        "unhealthy": view.unhealthy,
                    }
                )
            self.view = view
            upkeep = await run_activity(
                ReaperActivities.fleet_upkeep,
                workflow.now(),
                summary="place owed work, reap strays",
            )
            await tell_placed(upkeep.placed)
            workflow.deprecate_patch(CHANGE_FEED)
            await run_activity(
                ReaperActivities.nudge_changed, None, summary="ask changed workers for a diff"
            )
            if repair is None or repair.done():
                workflow.deprecate_patch(REPAIR_STUCK)
                if repair is not None:
                    await finish_repair(repair)
                repair = workflow.start_activity_method(
                    ReaperActivities.repair_stuck,
                    workflow.now(),
                    start_to_close_timeout=REPAIR_TIMEOUT,
                    heartbeat_timeout=REPAIR_HEARTBEAT,
                    retry_policy=REPAIR_RETRY,
                    summary="repair stuck livenesses",
                )
            # Metadata, not history: shown afresh at every check.
            workflow.set_current_details(fleet_details(view, timings, len(upkeep.placed)))
            tick = timedelta(seconds=timings.heartbeat_interval)
            if not rollout.uses(rollout.ROTATING_HOSTS, timings.peer_version):
                if should_continue_as_new():  # 1.1's order: before the tick, timings carried
                    await self._continue_as_new(repair, timings)
                await workflow.sleep(tick, summary="next fleet check")
                continue
            # Woken early, the timer is cancelled; and a run continues as new only after it
            # waited once, so a server that suggests it early (tests: 30 events) never makes
            # the checks run back to back. Both are commands a 1.1 replica would not give.
            with contextlib.suppress(asyncio.TimeoutError):  # the tick came
                await workflow.wait_condition(
                    lambda: self.upkeep_due, timeout=tick, timeout_summary="next fleet check"
                )
            self.upkeep_due = False
            if should_continue_as_new():
                await self._continue_as_new(repair)

    @staticmethod
    async def _continue_as_new(
        repair: workflow.ActivityHandle[RepairResult] | None, timings: Timings | None = None
    ) -> None:
        """Wait for the running repair (its result is logged and counted by it), then continue
        as new. A 1.2 run passes no input: the next run reads the settings of the controller
        that runs it (as every release's monitor does without one), so a changed setting,
        such as ``REAPER_PEER_VERSION``, reaches the monitor at its next run. A 1.1 run
        carries its timings, as 1.1.0 does: that read's events would make each of its runs
        continue as new at once on a server that suggests it early (the upgrade test's, every
        30 events: a run a second, and the test's listing of every run never ended)."""
        if repair is not None:
            await finish_repair(repair)
        if timings is None:
            workflow.continue_as_new()
        workflow.continue_as_new(timings)
