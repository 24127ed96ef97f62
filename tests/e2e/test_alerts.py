"""The shipped Prometheus alert rules (deploy/prometheus): valid for promtool, their unit tests
pass, each links a runbook, and they query only series the controller exports.

promtool comes from Debian's ``prometheus`` package (``make sysdeps``, a prerequisite of
``make test``); the Prometheus service itself is never started.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import UTC, datetime

import pytest
import yaml
from prometheus_client import REGISTRY

from activities import metrics as _series  # noqa: F401  (registers reaper's counters)
from reaper.core.policy.gauges import WorkerRow, fleet_gauges
from reaper.infra.metrics_endpoint import FleetCollector
from tests.support.paths import ROOT

RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
RUNBOOKS = {
    "runbook-lost-worker",
    "runbook-fleet-disruption",
    "runbook-owed-replacements",
    "runbook-rejected-heartbeats",
    "runbook-controller-down",
    "runbook-stuck-liveness",
    "runbook-reports-incomplete",
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: run `make sysdeps` (Debian's prometheus package)")
    return subprocess.run(
        [found, *args], capture_output=True, text=True, timeout=120, cwd=RULES.parent
    )


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_check_rules():
    done = promtool("check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_promtool_test_rules():
    done = promtool("test", "rules", RULE_TESTS.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_links_a_runbook_and_fires_in_a_unit_test():
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        case["alertname"] for t in tests for case in t["alert_rule_test"] if case.get("exp_alerts")
    }
    anchors = set()
    for rule in rules():
        url = rule["annotations"]["runbook_url"]
        path, _, anchor = url.partition("#")
        assert path == "docs/operator-guide.md" and anchor in RUNBOOKS, rule["alert"]
        anchors.add(anchor)
        assert rule["alert"] in fired, f"{rule['alert']} never fires in alerts_test.yml"
    assert anchors == RUNBOOKS  # lost, disruption, owed, rejected, controller down, stuck,
    # reports incomplete


def test_rules_query_only_exported_series():
    fleet = FleetCollector()
    now = datetime.now(UTC)
    fleet.gauges = fleet_gauges([WorkerRow("w1", "lost", now)], 0, 0.55, now, 30)
    fleet.refreshed_at = now.timestamp()
    exported = {s.name for m in [*REGISTRY.collect(), *fleet.collect()] for s in m.samples}
    queried = {n for r in rules() for n in re.findall(r"\breaper_[a-z_]+", r["expr"])}
    assert queried and queried <= exported, queried - exported
