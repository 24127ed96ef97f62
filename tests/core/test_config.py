"""Configuration (CONTRACT.md §1): durations, defaults, validation naming the variable."""

from __future__ import annotations

import pytest

from reaper.core.config import ConfigError, load_settings
from reaper.core.config_values import controllers_for, parse_duration, process_ports


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30s", 30),
        ("5m", 300),
        ("1h", 3600),
        ("1h30m", 5400),
        ("10", 10),
        (2.5, 2.5),
        ("250ms", 0.25),
    ],
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
        ({"REAPER_METRICS_PORT": "70000"}, "REAPER_METRICS_PORT"),
        ({"REAPER_METRICS_PORT": "-1"}, "REAPER_METRICS_PORT"),
        ({"REAPER_SDK_METRICS_PORT": "9464"}, "REAPER_SDK_METRICS_PORT"),
        ({"REAPER_METRICS_PORT": "x"}, "REAPER_METRICS_PORT"),
        ({"REAPER_WORKFLOW_TASK_POLLERS": "1"}, "REAPER_WORKFLOW_TASK_POLLERS"),
        ({"REAPER_WORKFLOW_TASK_POLLERS": "many"}, "REAPER_WORKFLOW_TASK_POLLERS"),
        ({"REAPER_WORKFLOW_CACHE": "0"}, "REAPER_WORKFLOW_CACHE"),
        ({"REAPER_CONTROLLERS": "0"}, "REAPER_CONTROLLERS"),
        # The second process's metrics port would be the first one's SDK port.
        ({"REAPER_CONTROLLERS": "2", "REAPER_SDK_METRICS_PORT": "9466"}, "REAPER_CONTROLLERS"),
        ({"REAPER_CONTROLLERS": "2", "REAPER_METRICS_PORT": "65534"}, "REAPER_CONTROLLERS"),
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


def test_metrics_ports_default_and_off(monkeypatch):
    s = load_settings(_env_file=None)
    assert (s.metrics_port, s.sdk_metrics_port) == (9464, 9465)  # CONTRACT.md §5.4
    monkeypatch.setenv("REAPER_METRICS_PORT", "0")
    monkeypatch.setenv("REAPER_SDK_METRICS_PORT", "0")
    s = load_settings(_env_file=None)
    assert (s.metrics_port, s.sdk_metrics_port) == (0, 0)  # both off: no clash


def test_controllers_default_follows_the_hosts_cores(monkeypatch):
    # One per two cores: one on the measured 2-core host (docs/capacity.md).
    assert [controllers_for(n) for n in (None, 1, 2, 3, 4, 16)] == [1, 1, 1, 1, 2, 8]
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert load_settings(_env_file=None).controllers == controllers_for(16) > 1
    monkeypatch.setattr("os.cpu_count", lambda: None)  # unknown: one
    assert load_settings(_env_file=None).controllers == 1
    monkeypatch.setenv("REAPER_CONTROLLERS", "3")
    assert load_settings(_env_file=None).controllers == 3


def test_each_controller_process_has_ports_of_its_own():
    assert process_ports(9464, 9465, 3) == [(9464, 9465), (9466, 9467), (9468, 9469)]
    assert process_ports(0, 9465, 2) == [(0, 9465), (0, 9467)]  # off stays off
    ports = [p for pair in process_ports(9000, 9100, 40) for p in pair]
    assert len(ports) == len(set(ports))
