"""All I/O of reaper: every SQL statement and outside call lives in this package."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from activities.changes import ChangeActivities
from activities.collection import CollectionActivities
from activities.destroy import DestroyActivities
from activities.draining import DrainActivities
from activities.fleet import FleetActivities
from activities.keys import KeyActivities
from activities.liveness import LivenessActivities
from activities.reap import ReapActivities
from activities.repair import RepairActivities
from activities.retire import RetireActivities
from activities.staging import StagingActivities


class ReaperActivities(
    LivenessActivities,
    DrainActivities,
    CollectionActivities,
    DestroyActivities,
    ReapActivities,
    RetireActivities,
    FleetActivities,
    ChangeActivities,
    StagingActivities,
    KeyActivities,
    RepairActivities,
):
    """Every activity, bound to one asyncpg pool and the controller's settings (and, for
    ``repair_stuck``, the controller's replay check: see
    :class:`activities.repair.RepairActivities`)."""

    def all(self) -> list[Callable[..., Any]]:
        """The bound activity methods, for ``Worker(activities=...)``."""
        return [
            self.load_timings,
            self.begin_liveness,
            self.record_worker_state,
            self.refresh_heartbeat,
            self.set_draining,
            self.drain_worker,
            self.fleet_status,
            self.fleet_upkeep,
            self.nudge_changed,
            self.repair_stuck,
            self.worker_record,
            self.retire_worker,
            self.reconcile_report,
            self.destroy_missing,
            self.reap_worker,
            self.stage_chunk,
            self.pin_agent_key,
        ]
