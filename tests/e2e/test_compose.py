"""Static checks of docker-compose.yml and the controller's Dockerfile.

There is no Docker engine on the project's machines (ENV.md), so the compose stack cannot be
started here: it is parsed, validated against a JSON schema of the Compose file format subset
the project uses (tests/e2e/data/compose-subset.schema.json, written for this project; services and
health checks reject unknown keys) and checked for pinned images, health checks,
healthy-dependency ordering and a controller environment that only uses contract variables.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from reaper.core.config import Settings, parse_duration
from tests.support.paths import ROOT

COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
SCHEMA = Path(__file__).resolve().parent / "data" / "compose-subset.schema.json"

CONTROLLER = "reaper"
#: The public configuration variables of CONTRACT.md section 1, with their documented defaults
#: (None: the default is the embedded stack, which the compose file must not rely on).
CONTRACT_VARIABLES: dict[str, str | None] = {
    "REAPER_TEMPORAL_ADDRESS": None,
    "REAPER_NAMESPACE": "default",
    "REAPER_TASK_QUEUE": "reaper",
    "REAPER_DATABASE_URL": None,
    "REAPER_HEARTBEAT_INTERVAL": "10s",
    "REAPER_STALL_AFTER": "30s",
    "REAPER_LOST_AFTER": "5m",
    "REAPER_MISSING_TTL": "5m",
    "REAPER_CREATING_TIMEOUT": "1h",
    "REAPER_DISRUPTION_THRESHOLD": "0.55",
}
DURATIONS = {
    "REAPER_HEARTBEAT_INTERVAL",
    "REAPER_STALL_AFTER",
    "REAPER_LOST_AFTER",
    "REAPER_MISSING_TTL",
    "REAPER_CREATING_TIMEOUT",
}
SEARCH_ATTRIBUTES = {"ReaperWorker": "Keyword", "ReaperState": "Keyword", "ReaperMissing": "Int"}

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err} (Compose interpolation).
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: str) -> str:
    """``value`` as Compose would see it with an empty shell environment: defaults applied."""

    def substitute(match: re.Match[str]) -> str:
        op, arg = match.group(2), match.group(3)
        if op in (":-", "-"):
            return arg
        raise AssertionError(f"{match.group(0)} has no default: `docker compose up` needs it set")

    return _INTERPOLATION.sub(substitute, value.replace("$$", "\0")).replace("\0", "$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    with COMPOSE.open(encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    assert isinstance(compose.get("services"), dict) and compose["services"]
    return compose["services"]


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as a dict, whichever of the two Compose forms it uses."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def healthcheck_text(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    return test if isinstance(test, str) else " ".join(test)


def test_schema_is_our_compose_subset() -> None:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert schema["title"] == "Compose file subset used by reaper"
    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)
    # It rejects what it should: the schema is not a permissive stand-in.
    errors = list(validator(schema).iter_errors({"services": {"x": {"image": 1}}, "bogus": 1}))
    assert len(errors) >= 2


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
    ],
)
def test_schema_rejects_service_mistakes(service: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    validator = jsonschema.validators.validator_for(schema)(schema)
    assert list(validator.iter_errors({"services": {"x": service}}))


def test_compose_file_validates_against_the_compose_specification(
    compose: dict[str, Any],
) -> None:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    validator_cls = jsonschema.validators.validator_for(schema)
    errors = sorted(validator_cls(schema).iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, "\n".join(
        f"{'/'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in errors
    )


def test_expected_services(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) >= {"postgres", "temporal", "temporal-ui", CONTROLLER}


def test_every_image_is_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        if "image" not in svc:
            assert "build" in svc, f"{name}: neither image nor build"
            continue
        image = interpolate(svc["image"])
        reference = image.split("@", 1)[0]
        repo, sep, tag = reference.rpartition(":")
        assert sep and "/" not in tag, f"{name}: image {image!r} has no tag"
        assert tag != "latest", f"{name}: image {image!r} uses latest"
        assert re.search(r"\d", tag), f"{name}: tag of {image!r} names no version"
        assert repo, f"{name}: image {image!r}"


def test_images_named_in_the_brief(services: dict[str, dict[str, Any]]) -> None:
    assert services["postgres"]["image"].startswith("postgres:")
    assert re.fullmatch(r"postgres:\d+\.\d+(-\S+)?", services["postgres"]["image"])
    assert services["temporal"]["image"].startswith("temporalio/auto-setup:")
    assert services["temporal-ui"]["image"].startswith("temporalio/ui:")
    controller = services[CONTROLLER]
    assert "build" in controller
    build = controller["build"]
    dockerfile = build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile"
    context = build.get("context", ".") if isinstance(build, dict) else build
    assert (ROOT / context / dockerfile).resolve() == DOCKERFILE


def test_every_service_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        check = svc.get("healthcheck")
        assert check and not check.get("disable"), f"{name}: no healthcheck"
        assert check.get("test"), f"{name}: healthcheck without a test"
        assert check["test"] != ["NONE"], f"{name}: healthcheck disabled"
    assert "pg_isready" in healthcheck_text(services["postgres"])
    assert "cluster health" in healthcheck_text(services["temporal"])
    assert re.search(r"\b(wget|curl)\b", healthcheck_text(services["temporal-ui"]))
    assert "python" in healthcheck_text(services[CONTROLLER])


def test_controller_healthcheck_is_valid_python(services: dict[str, dict[str, Any]]) -> None:
    test = services[CONTROLLER]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    compile(test[3], "<healthcheck>", "exec")


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
            assert "healthcheck" in services[dep]
    assert set(services[CONTROLLER]["depends_on"]) == {"postgres", "temporal"}
    assert set(services["temporal"]["depends_on"]) == {"postgres"}
    assert set(services["temporal-ui"]["depends_on"]) == {"temporal"}


def test_postgres_data_is_on_a_named_volume(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    named = set(compose.get("volumes") or {})
    sources = []
    for mount in services["postgres"].get("volumes", []):
        if isinstance(mount, str):
            source, _, target = mount.partition(":")
            target = target.split(":")[0]
        else:
            source, target = mount.get("source"), mount.get("target")
        if target.startswith("/var/lib/postgresql"):
            sources.append(source)
    assert sources and all(s in named for s in sources), (sources, named)


def test_ui_is_published_on_8233(services: dict[str, dict[str, Any]]) -> None:
    ports = [interpolate(str(p)) for p in services["temporal-ui"]["ports"]]
    assert "8233:8080" in ports
    assert any(str(p).endswith("7233:7233") for p in services["temporal"]["ports"])


def test_temporal_registers_the_search_attributes(services: dict[str, dict[str, Any]]) -> None:
    temporal = services["temporal"]
    script = " ".join(temporal.get("command") or [])
    for name, kind in SEARCH_ATTRIBUTES.items():
        assert f'"{name} {kind}"' in script, name
    assert "search-attribute create" in script
    assert "exec /etc/temporal/entrypoint.sh autosetup" in script
    assert "ReaperMissing" in healthcheck_text(temporal)


def test_contract_variables_are_settings_fields() -> None:
    fields = Settings.model_fields
    prefix = Settings.model_config["env_prefix"]
    for name in CONTRACT_VARIABLES:
        assert name.startswith(prefix)
        assert name[len(prefix) :].lower() in fields, f"{name} is not a Settings field"


def test_controller_environment_uses_only_contract_variables(
    services: dict[str, dict[str, Any]],
) -> None:
    env = environment(services[CONTROLLER])
    assert env["REAPER_TEMPORAL_ADDRESS"] == "temporal:7233"
    assert re.fullmatch(
        r"postgresql://[^@/]+@postgres:5432/reaper", interpolate(env["REAPER_DATABASE_URL"])
    ), env["REAPER_DATABASE_URL"]
    unknown = set(env) - set(CONTRACT_VARIABLES)
    assert not unknown, f"controller environment uses non-contract variables: {sorted(unknown)}"


def test_controller_timing_defaults_are_the_contract_defaults(
    services: dict[str, dict[str, Any]],
) -> None:
    env = environment(services[CONTROLLER])
    for name in DURATIONS | {"REAPER_DISRUPTION_THRESHOLD"}:
        assert name in env, f"{name} not shown in the controller's environment"
        value = interpolate(env[name])
        default = CONTRACT_VARIABLES[name]
        assert default is not None
        if name in DURATIONS:
            assert parse_duration(value) == parse_duration(default), name
        else:
            assert float(value) == float(default), name
        field = name.removeprefix("REAPER_").lower()
        assert float(Settings.model_fields[field].default) == (
            parse_duration(default) if name in DURATIONS else float(default)
        ), name


def test_controller_environment_is_a_valid_configuration(
    services: dict[str, dict[str, Any]],
) -> None:
    env = {k: interpolate(v) for k, v in environment(services[CONTROLLER]).items()}
    settings = Settings(
        _env_file=None, **{k.removeprefix("REAPER_").lower(): v for k, v in env.items()}
    )
    assert settings.temporal_address == "temporal:7233"
    assert settings.database_url and settings.database_url.startswith("postgresql://")


def test_dockerfile_base_is_pinned_and_runs_worker() -> None:
    lines = [
        line.strip()
        for line in DOCKERFILE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    froms = [line.split()[1] for line in lines if line.upper().startswith("FROM ")]
    assert froms, "no FROM"
    for image in froms:
        repo, sep, tag = image.split("@", 1)[0].rpartition(":")
        assert sep and tag != "latest" and re.match(r"3\.11\.\d+", tag), image
        assert repo in ("python", "docker.io/library/python"), image
    cmds = [line for line in lines if line.upper().startswith("CMD ")]
    assert cmds, "no CMD"
    cmd = cmds[-1][4:].strip()
    argv = json.loads(cmd) if cmd.startswith("[") else cmd.split()
    assert argv == ["python", "worker.py"], argv
    users = [line.split()[1] for line in lines if line.upper().startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), "the controller must not run as root"
    assert any(re.search(r"\bpip install\b.*\s\.(\s|$)", line) for line in lines), (
        "the project is installed with pip"
    )


def test_dockerignore_keeps_the_project_installable() -> None:
    ignored = {
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", ".reaper", ".env"} <= ignored
    for needed in ("pyproject.toml", "worker.py", "reaper", "activities", "workflows", "bench"):
        assert needed not in ignored, needed
