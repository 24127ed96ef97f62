"""Table-driven tests of the pure rules (reaper/rules.py) and configuration validation."""

from datetime import datetime, timedelta, timezone

import pytest

from reaper.core.policy import collection, fleet, liveness, placement
from reaper.core import protocol
from reaper.core.config import ConfigError, load_settings, parse_duration
from reaper.core.contract import Heartbeat, WorkerState
from reaper.core.policy.fleet import FleetState
from reaper.core.policy.liveness import Fence

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "current, last_seq, previous, boot, seq, expected",
    [
        (None, -1, [], "b1", 0, Fence.new_boot),          # first beat ever
        ("b1", 5, [], "b1", 6, Fence.accept),              # next seq
        ("b1", 5, [], "b1", 5, Fence.stale_seq),           # duplicate delivery
        ("b1", 5, [], "b1", 3, Fence.stale_seq),           # late, out of order
        ("b2", 0, ["b1"], "b1", 99, Fence.old_boot),       # late beat of an older boot
        ("b1", 5, [], "b2", 0, Fence.new_boot),            # restart with fresh state
        ("b2", 7, ["b1"], "b3", 0, Fence.new_boot),
    ],
)
def test_fence_seq_and_boot_id_decide(current, last_seq, previous, boot, seq, expected):
    assert liveness.fence(current, last_seq, previous, boot, seq) is expected


def test_remember_boot_is_bounded():
    previous: list[str] = []
    for i in range(40):
        previous = liveness.remember_boot(previous, f"b{i}")
    assert len(previous) == liveness.MAX_REMEMBERED_BOOT_IDS
    assert previous[-1] == "b39"


@pytest.mark.parametrize(
    "silent, expected",
    [(0, WorkerState.running), (29.9, WorkerState.running), (30, WorkerState.stalled),
     (299, WorkerState.stalled), (300, WorkerState.lost), (10_000, WorkerState.lost)],
)
def test_judge_liveness_on_controller_clock(silent, expected):
    assert liveness.judge_liveness(T0, at(silent), 30, 300) is expected


@pytest.mark.parametrize(
    "state, grace, expected",
    [
        (WorkerState.running, None, at(30)),
        (WorkerState.stalled, None, at(300)),
        (WorkerState.stalled, at(100), at(300)),   # grace ending before lost changes nothing
        (WorkerState.stalled, at(400), at(400)),   # grace after an outage postpones lost
        (WorkerState.lost, None, None),
    ],
)
def test_next_deadline(state, grace, expected):
    assert liveness.next_deadline(T0, state, 30, 300, grace) == expected


@pytest.mark.parametrize(
    "late, expected",
    [(0, None), (10, None), (10.5, at(10.5 + 30)), (600, at(600 + 30))],
)
def test_outage_grace_only_when_timer_fired_late(late, expected):
    assert liveness.outage_grace(T0, at(late), 10, 30) == expected


@pytest.mark.parametrize(
    "healthy, unhealthy, threshold, expected",
    [
        (0, 0, 0.55, FleetState.normal),
        (10, 0, 0.55, FleetState.normal),
        (9, 1, 0.55, FleetState.partial),
        (5, 5, 0.55, FleetState.partial),
        (45, 55, 0.55, FleetState.full),     # at the threshold: full
        (0, 3, 0.55, FleetState.full),
        (2, 1, 0.3, FleetState.full),
        (1, 1, 1.0, FleetState.partial),
        (0, 1, 1.0, FleetState.full),
    ],
)
def test_fleet_state(healthy, unhealthy, threshold, expected):
    assert fleet.fleet_state(healthy, unhealthy, threshold) is expected


def test_report_digest_ignores_order_and_repeats():
    assert protocol.report_digest(["a", "b"]) == protocol.report_digest(["b", "a", "a"])
    assert protocol.report_digest(["a"]) != protocol.report_digest(["a", "b"])
    assert protocol.report_digest([]) != protocol.report_digest([""])
    # no ambiguity from concatenation
    assert protocol.report_digest(["ab", "c"]) != protocol.report_digest(["a", "bc"])


@pytest.mark.parametrize(
    "candidates, count, expected",
    [
        ({}, 2, []),
        ({"w1": 0}, 3, ["w1", "w1", "w1"]),
        ({"w1": 2, "w2": 0, "w3": 1}, 3, ["w2", "w2", "w3"]),
        ({"b": 1, "a": 1}, 1, ["a"]),  # ties: deterministic by name
    ],
)
def test_place_on_fewest_running(candidates, count, expected):
    assert placement.place(candidates, count) == expected


@pytest.mark.parametrize(
    "digest, fwd, taken, fwd_at, wanted, expected",
    [
        ("x", None, 0, None, False, (True, "changed")),
        ("y", "x", 10, 0, False, (True, "changed")),
        ("x", "x", 10, 0, False, (False, "unchanged")),
        ("x", "x", 10, 0, True, (True, "due")),
        ("x", "x", 30, 0, False, (True, "resync")),
    ],
)
def test_should_forward(digest, fwd, taken, fwd_at, wanted, expected):
    d = collection.should_forward(digest, fwd, at(taken), at(fwd_at) if fwd_at is not None else None,
                             30, wanted)
    assert (d.forward, d.reason) == expected


def test_coalesce_keeps_handles_seen_in_superseded_reports():
    assert collection.coalesce(["a", "b"], [], ["a"]) == ["b"]
    assert collection.coalesce(["a"], ["z"], ["a"]) == ["z"]
    assert collection.coalesce(["a"], ["z"], ["z", "a"]) == []


# ---- configuration (CONTRACT.md §1) ---------------------------------------------------

@pytest.mark.parametrize(
    "text, seconds",
    [("30s", 30), ("5m", 300), ("1h", 3600), ("1h30m", 5400), ("10", 10), (2.5, 2.5),
     ("250ms", 0.25)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "5x", "m5", "-3", "1h 2m", True, None])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize(
    "env, variable",
    [
        ({"REAPER_STALL_AFTER": "15s"}, "REAPER_STALL_AFTER"),
        ({"REAPER_LOST_AFTER": "30s"}, "REAPER_LOST_AFTER"),
        ({"REAPER_MISSING_TTL": "20s"}, "REAPER_MISSING_TTL"),
        ({"REAPER_DISRUPTION_THRESHOLD": "0"}, "REAPER_DISRUPTION_THRESHOLD"),
        ({"REAPER_DISRUPTION_THRESHOLD": "1.5"}, "REAPER_DISRUPTION_THRESHOLD"),
        ({"REAPER_HEARTBEAT_INTERVAL": "soon"}, "REAPER_HEARTBEAT_INTERVAL"),
    ],
)
def test_bad_configuration_names_the_variable(monkeypatch, env, variable):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as err:
        load_settings(_env_file=None)
    assert str(err.value).startswith(variable)


def test_flags_override_environment(monkeypatch):
    monkeypatch.setenv("REAPER_HEARTBEAT_INTERVAL", "10s")
    s = load_settings(_env_file=None, heartbeat_interval="2s", stall_after="4s")
    assert (s.heartbeat_interval, s.stall_after) == (2, 4)
    assert s.lost_after == 300 and s.missing_ttl == 300 and s.disruption_threshold == 0.55


# ---- heartbeat payload validation (CONTRACT.md §2) --------------------------------------

GOOD = {"worker": "w1", "boot_id": "b", "seq": 0}


@pytest.mark.parametrize(
    "patch",
    [
        {"worker": ""}, {"worker": "w 1"}, {"worker": "w/1"}, {"worker": "x" * 254},
        {"seq": -1}, {"seq": "x"}, {"seq": "7"}, {"seq": 1.5}, {"seq": True},
        {"boot_id": ""}, {"containers": ["ok", ""]}, {"containers": ["a\nb"]},
        {"volumes": ["x" * 513]}, {"tasks": "t-1"}, {"containers": [1]},
    ],
)
def test_malformed_heartbeats_are_rejected(patch):
    with pytest.raises(ValueError):
        Heartbeat.model_validate({**GOOD, **patch})


def test_valid_heartbeat_shapes():
    hb = Heartbeat.model_validate({**GOOD, "worker": "node-1.eu:a_b".replace("_", "-"),
                                   "containers": [], "volumes": None, "future": 1})
    assert hb.containers == [] and hb.volumes is None and hb.is_complete_report
    assert not Heartbeat.model_validate(GOOD).is_complete_report
    assert Heartbeat.model_validate({**GOOD, "worker": "x" * 253}).worker
