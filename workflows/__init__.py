"""Deterministic orchestration only: no I/O here, all of it is in ``activities``."""

from workflows.collector import HandleCollector
from workflows.fleet import FleetMonitor
from workflows.liveness import WorkerLiveness
from workflows.reap import WorkerReap

ALL_WORKFLOWS = [WorkerLiveness, HandleCollector, WorkerReap, FleetMonitor]
