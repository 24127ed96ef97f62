"""Static checks of docker-compose.yml: schemas, services, images, health checks, ordering.

There is no Docker engine on the project's machines (docs/platform-notes.md), so the production
stack cannot be started here. It is parsed and validated twice: against the Compose
Specification's own JSON schema (the copy the pinned ``check-jsonschema`` package ships) and
against a stricter schema of the subset the project uses
(tests/e2e/data/compose-subset.schema.json, which rejects unknown keys, so a typo fails). Then:
pinned images, a health check on every service, healthy-dependency ordering, a real Temporal
server on Postgres (not the dev server) and the search attributes. Files, secrets, Prometheus
and the controllers' environment are in test_compose_stack.py.
"""

from __future__ import annotations

import importlib.resources
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.support.compose import (
    DOCKERFILE,
    controllers,
    environment,
    healthcheck_text,
    interpolate,
    load_compose,
    repo_path,
)

SUBSET_SCHEMA = Path(__file__).resolve().parent / "data" / "compose-subset.schema.json"
SEARCH_ATTRIBUTES = {"ReaperWorker": "Keyword", "ReaperState": "Keyword", "ReaperMissing": "Int"}
"""CONTRACT.md §2."""
SERVICES = {"postgres", "temporal", "temporal-admin-tools", "temporal-ui", "prometheus", "grafana"}


def spec_schema() -> dict[str, Any]:
    """The Compose Specification's JSON schema, as shipped by ``check-jsonschema``."""
    vendored = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema: dict[str, Any] = json.loads((vendored / "compose-spec.json").read_text("utf-8"))
    return schema


def subset_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SUBSET_SCHEMA.read_text(encoding="utf-8"))
    return schema


def _errors(schema: dict[str, Any], instance: Any) -> list[str]:
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.path))
    return [f"{'/'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in errors]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    assert isinstance(compose.get("services"), dict) and compose["services"]
    return compose["services"]


def test_compose_file_validates_against_the_compose_specification(
    compose: dict[str, Any],
) -> None:
    schema = spec_schema()
    assert "compose" in schema.get("$id", "") and "services" in schema["properties"]
    assert not (errors := _errors(schema, compose)), "\n".join(errors)
    # The upstream schema is a real check, not a permissive stand-in.
    assert _errors(schema, {"services": {"x": {"image": "x:1", "restart": 3}}})


def test_compose_file_validates_against_our_strict_subset(compose: dict[str, Any]) -> None:
    assert not (errors := _errors(subset_schema(), compose)), "\n".join(errors)


def test_subset_schema_is_ours_and_strict() -> None:
    schema = subset_schema()
    assert schema["title"] == "Compose file subset used by reaper"
    jsonschema.validators.validator_for(schema).check_schema(schema)
    assert len(_errors(schema, {"services": {"x": {"image": 1}}, "bogus": 1})) >= 2


_HC = {"test": "true"}


@pytest.mark.parametrize(
    "service",
    [
        pytest.param({"imgae": "postgres:16.4"}, id="service-key-typo"),
        pytest.param({"image": "x:1", "healthcheck": {**_HC, "retry": 3}}, id="healthcheck-typo"),
        pytest.param({"image": "x:1", "healthcheck": {**_HC, "retries": "3"}}, id="retries-type"),
        pytest.param({"image": "x:1", "healthcheck": {"test": ["RUN", "true"]}}, id="test-form"),
        pytest.param({"image": "x:1", "healthcheck": {**_HC, "interval": "5 sec"}}, id="duration"),
        pytest.param({"image": "x:1", "restart": "sometimes"}, id="restart-policy"),
        pytest.param({"image": "x:1", "depends_on": {"db": {"condition": "up"}}}, id="condition"),
        pytest.param({"image": "x:1", "environment": {"A": {"nested": 1}}}, id="env-value"),
        pytest.param({"image": "x:1", "ports": [{"published": 80}]}, id="port-without-target"),
        pytest.param({"command": "true"}, id="neither-image-nor-build"),
        pytest.param({"image": "x:1", "secrets": [{"target": "x"}]}, id="secret-without-source"),
    ],
)
def test_subset_schema_rejects_service_mistakes(service: dict[str, Any]) -> None:
    assert _errors(subset_schema(), {"services": {"x": service}})


def test_subset_schema_rejects_a_secret_without_a_source() -> None:
    assert _errors(subset_schema(), {"services": {}, "secrets": {"pw": {"fiel": "pw.txt"}}})


def test_expected_services(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) >= SERVICES
    assert len(controllers(services)) >= 2, "two controller replicas built from the Dockerfile"


def test_every_image_is_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        assert "$" not in svc.get("image", ""), f"{name}: image chosen by a variable"
        if "build" in svc:
            continue
        image = svc["image"]
        reference, _, digest = image.partition("@")
        if digest:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{name}: digest {digest!r}"
        repo, sep, tag = reference.rpartition(":")
        assert sep and repo and "/" not in tag, f"{name}: image {image!r} has no tag"
        assert tag != "latest" and re.search(r"\d+\.\d+", tag), f"{name}: {image!r} not exact"


def test_images_named_in_the_brief(services: dict[str, dict[str, Any]]) -> None:
    assert re.fullmatch(r"postgres:\d+\.\d+(-\S+)?", services["postgres"]["image"])
    assert services["temporal"]["image"].startswith("temporalio/auto-setup:")
    assert services["temporal-admin-tools"]["image"].startswith("temporalio/admin-tools:")
    assert services["temporal-ui"]["image"].startswith("temporalio/ui:")
    assert services["prometheus"]["image"].startswith("prom/prometheus:v")
    assert services["grafana"]["image"].startswith("grafana/grafana:")
    for name, svc in controllers(services).items():
        build = svc["build"]
        context = build.get("context", ".") if isinstance(build, dict) else build
        dockerfile = build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else ""
        assert repo_path(context) / (dockerfile or "Dockerfile") == DOCKERFILE, name


def test_temporal_is_a_server_on_postgres_not_the_dev_server(
    services: dict[str, dict[str, Any]],
) -> None:
    temporal = services["temporal"]
    env = environment(temporal)
    assert env["DB"].startswith("postgres") and env["POSTGRES_SEEDS"] == "postgres"
    script = " ".join(temporal.get("command") or [])
    assert "exec /etc/temporal/entrypoint.sh autosetup" in script
    for svc in services.values():
        assert "start-dev" not in json.dumps(svc), "the dev server has no place here"


def test_every_service_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        check = svc.get("healthcheck")
        assert check and not check.get("disable"), f"{name}: no healthcheck"
        assert check.get("test") and check["test"] != ["NONE"], f"{name}: healthcheck disabled"
    expected = {
        "postgres": "pg_isready",
        "temporal": "cluster health",
        "temporal-admin-tools": "search-attribute list",
        "temporal-ui": "http://127.0.0.1:8080/",
        "prometheus": "/-/ready",
        "grafana": "/api/health",
    }
    for name, needle in expected.items():
        assert needle in healthcheck_text(services[name]), name


def test_controller_healthcheck_checks_this_replica(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in controllers(services).items():
        test = svc["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"], name
        compile(test[3], "<healthcheck>", "exec")
        # This replica's own poller (pid@hostname) and its own metrics endpoint.
        assert "socket.gethostname()" in test[3] and "REAPER_METRICS_PORT" in test[3], name


def test_restart_policies(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        policy = svc.get("restart") or (svc.get("deploy") or {}).get("restart_policy")
        assert policy and policy != "no", f"{name}: no restart policy"


def test_depends_on_waits_for_healthy_services(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        assert isinstance(deps, dict), f"{name}: depends_on must name conditions"
        for dep, spec in deps.items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            assert spec.get("condition") == "service_healthy", f"{name} -> {dep}"
    for name, svc in controllers(services).items():
        assert set(svc["depends_on"]) == {"postgres", "temporal", "temporal-admin-tools"}, name
    assert set(services["temporal"]["depends_on"]) == {"postgres"}
    assert set(services["temporal-admin-tools"]["depends_on"]) == {"temporal"}
    assert set(services["temporal-ui"]["depends_on"]) == {"temporal"}


def test_controller_replicas_are_distinct_hosts(services: dict[str, dict[str, Any]]) -> None:
    replicas = controllers(services)
    hosts = [svc.get("hostname", name) for name, svc in replicas.items()]
    assert len(set(hosts)) == len(hosts), hosts
    for name, svc in replicas.items():
        assert "container_name" not in svc, f"{name}: a fixed container name blocks scaling"
        assert not svc.get("ports"), f"{name}: controllers publish nothing (metrics stay inside)"


def test_state_is_on_named_volumes(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    named = set(compose.get("volumes") or {})
    for name, data_dir in (
        ("postgres", "/var/lib/postgresql"),
        ("prometheus", "/prometheus"),
        ("grafana", "/var/lib/grafana"),
    ):
        sources = [
            str(m).split(":")[0]
            for m in services[name].get("volumes", [])
            if str(m).split(":")[1].startswith(data_dir)
        ]
        assert sources and all(s in named for s in sources), (name, sources, named)


def test_published_ports(services: dict[str, dict[str, Any]]) -> None:
    def ports(name: str) -> list[str]:
        return [interpolate(str(p)) for p in services[name].get("ports", [])]

    assert "8233:8080" in ports("temporal-ui")
    assert "7233:7233" in ports("temporal"), "agents reach the frontend on 7233"
    # Operators' consoles and the database only on the loopback interface.
    for name in ("postgres", "prometheus", "grafana"):
        assert ports(name) and all(p.startswith("127.0.0.1:") for p in ports(name)), name


def test_admin_tools_register_the_search_attributes(services: dict[str, dict[str, Any]]) -> None:
    admin = services["temporal-admin-tools"]
    script = " ".join(admin.get("command") or [])
    for name, kind in SEARCH_ATTRIBUTES.items():
        assert f'"{name} {kind}"' in script, name
    assert "search-attribute create" in script and "--namespace default" in script
    assert "ReaperMissing" in healthcheck_text(admin)
    assert environment(admin)["TEMPORAL_ADDRESS"] == "temporal:7233"
