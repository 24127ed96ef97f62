"""Controller configuration: environment variables (``REAPER_*``, or a ``.env`` file) and flags.

The names, defaults and validation rules are the public contract (CONTRACT.md section 1).
Durations are seconds (a number) or a string such as ``30s``, ``5m``, ``1h``, ``1h30m``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BeforeValidator, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from reaper.core.config_values import Seconds, controllers_for, parse_keys, process_ports
from reaper.core.policy import rollout
from reaper.core.policy.auth import AuthMode
from reaper.core.policy.rollout import DEFAULT_PEER_VERSION

SettingsT = TypeVar("SettingsT", bound=BaseSettings)


class ConfigError(Exception):
    """A configuration that the controller refuses to start with; the message names the
    variable (``REAPER_<FIELD>``)."""


class ConnectionSettings(BaseSettings):
    """Where Temporal and Postgres are: all that the operator commands that read or signal
    (``reaper workers``, ``events``, ``drain`` ...) need. They load only these, so a
    controller timing that is out of range (a ``.env`` shared with the controller) never
    stops them; the controller and ``reaper run`` load :class:`Settings`, which checks it.

    ``temporal_address`` and ``database_url`` are ``None`` when the embedded stack is meant.
    """

    model_config = SettingsConfigDict(
        env_prefix="REAPER_", env_file=".env", extra="ignore", validate_default=True
    )

    temporal_address: str | None = None
    namespace: str = "default"
    task_queue: str = "reaper"
    database_url: str | None = None
    state_dir: str = ".reaper"


class Settings(ConnectionSettings):
    """All controller settings; see CONTRACT.md section 1 for the public ones.

    Attributes are plain values: durations in seconds (float), the threshold a fraction.
    ``temporal_address`` and ``database_url`` are ``None`` when the embedded stack is meant.
    """

    heartbeat_interval: Seconds = 10.0
    stall_after: Seconds = 30.0
    lost_after: Seconds = 300.0
    missing_ttl: Seconds = 300.0
    creating_timeout: Seconds = 3600.0
    disruption_threshold: float = 0.55
    retire_after: Seconds = 86400.0
    """A worker ``lost`` this long, its reap done, is retired automatically (CONTRACT.md
    §5.1; Nomad's ``node_gc_threshold`` is 24 h); at least ``lost_after``."""
    drain_deadline: Seconds = 3600.0
    """``REAPER_DRAIN_DEADLINE``: a migrating drain's deadline when its ``drain`` names none
    (CONTRACT.md §6.1): what is still on the worker then is stopped and backfilled. One hour,
    as Nomad's ``node drain -deadline``; at least ``2 * heartbeat_interval``."""
    agent_auth: AuthMode = AuthMode.pin
    """``REAPER_AGENT_AUTH`` (CONTRACT.md §5.2): ``off`` (v1), ``pin`` (a worker's first signed
    heartbeat pins its key) or ``required`` (unsigned heartbeats and operator signals are
    rejected)."""
    operator_keys: Annotated[tuple[str, ...], NoDecode, BeforeValidator(parse_keys)] = ()
    """``REAPER_OPERATOR_KEYS``: operators' Ed25519 public keys (standard base64 of 32 bytes),
    separated by commas or whitespace; they sign operator signals in ``required`` mode."""
    operator_keys_file: str | None = None
    """``REAPER_OPERATOR_KEYS_FILE``: a file of further operator public keys, one per line
    (``#`` comments allowed), for secrets mounted as files (Compose, Kubernetes)."""
    # Beyond the contract (project's own design):
    resync_interval: Seconds = 30.0
    """CONTRACT.md §5.3: a change to a worker's rows (the scheduler's insert, a state change,
    a move or a delete) is diffed against the worker's next complete report within
    ``RESYNC_INTERVAL + 2 x HEARTBEAT_INTERVAL``. reaper meets it with a change feed (triggers
    on the handle tables, read by the fleet monitor every heartbeat interval), not by
    re-diffing every unchanged report: an unchanged report of unchanged rows is a no-op diff
    (seconds; at least ``heartbeat_interval``)."""
    full_resync_interval: Seconds = 600.0
    """Safety net beside the change feed: an unchanged complete report is diffed against
    Postgres at least this often even when no change to its rows was recorded (a change
    made with triggers disabled, a ``TRUNCATE``), like a Kubernetes informer's resync
    period (seconds; at least ``resync_interval``)."""
    dry_run: bool = False
    """Record what would be marked, destroyed and reaped (``would-`` events); change no
    container, volume or task."""
    max_drop_fraction: float = 0.5
    """A complete report that drops more than this fraction of a worker's handles of a kind
    at once (same boot id) marks nothing until the next report confirms it."""
    suspect_min_handles: int = 10
    """The drop check applies only to workers holding at least this many handles of a kind."""
    reap_rate: float = 1.0
    """Automatic reaps per second at most, fleet-wide (Kubernetes ``--node-eviction-rate``
    is 0.1/s; reaper reaps tasks, not nodes, so its default is higher)."""
    reap_burst: int = 10
    """Automatic reaps allowed at once before ``reap_rate`` applies (token bucket size)."""
    sticky_timeout: Seconds = 5.0
    """How long a workflow task waits on the sticky queue of the replica that has the workflow
    cached before any replica may take it (the SDK's ``sticky_queue_schedule_to_start_timeout``,
    10 s by default): the bound on how long a SIGKILLed replica's workflows wait to move."""
    workflow_task_pollers: int = 20
    """``REAPER_WORKFLOW_TASK_POLLERS``: how many workflow-task polls each controller keeps open
    at once (the SDK's ``PollerBehaviorSimpleMaximum``, 5 by default; at least 2), half on
    the task queue all replicas share, where every new worker's first task comes, half on
    the controller's sticky queue (``reaper.infra.temporal.SHARED_QUEUE_POLL_SHARE``). At
    the SDK's defaults a fleet that boots at once registered one poll at a time: 5,000
    workers in 131-132 s on two cores, 72-97 s at 20 (BENCHMARKS.md metric 8b, issue 20).
    Temporal's worker performance guide: raise pollers while tasks wait in the queue and
    the worker has slots and CPU to spare."""
    workflow_cache: int = 10_000
    """``REAPER_WORKFLOW_CACHE``: how many workflow runs this controller keeps in memory between
    their tasks (the SDK's ``max_cached_workflows``, 1,000 by default; at least 1). Each
    worker has two (its liveness and its collector). A run that is not cached is replayed
    from its history at its next task: below twice the workers a replica serves, memory is
    traded for CPU and history reads. At the SDK's default a fleet past 500 workers replayed
    on every beat (BENCHMARKS.md metric 6); at 10,000 workers two replicas cached 9,000 runs
    each in 1.5 GiB of memory (metric 7c), about 150 KiB a run."""
    peer_version: str = DEFAULT_PEER_VERSION
    """``REAPER_PEER_VERSION``: the oldest reaper release line (``major.minor``) that may serve
    the same task queue as this controller, as during a rolling upgrade. A change of the
    workflows' commands is used only when every such peer knows it
    (``reaper.core.policy.rollout``; Kafka's ``inter.broker.protocol.version``). The default
    is the previous line, so an upgrade from it needs nothing set; set this controller's own
    line once no older controller serves (CHANGELOG.md says when each release lets you)."""
    workflow_sandbox: bool = False
    """``REAPER_WORKFLOW_SANDBOX``: run the workflows in the Temporal SDK's sandbox, which checks
    at run time that workflow code calls nothing non-deterministic (``datetime.now``,
    ``random``, I/O). Off by default: every workflow module is already passed through, so
    the sandbox only adds its checks, at about 1.3 to 1.8 ms of controller CPU per heartbeat
    (a sixth of a beat's cost) and 2 to 3 ms per registration (BENCHMARKS.md "Where the
    controller's CPU goes"; Temporal's sandbox guide lists disabling it as the way to trade
    those checks for speed). The test suite's in-process controllers always run sandboxed,
    so every workflow path the tests take is checked. Turn it on when running changed
    workflow code."""
    workflow_inline: bool = False
    """``REAPER_WORKFLOW_INLINE``: run workflow activations on the event loop, not the SDK's
    thread pool (``InlineActivations``): a fifth less CPU a beat (2.06 against 2.62 ms,
    BENCHMARKS.md metric 1, issue 36), without the SDK's 2 s deadlock detection. Off until a
    fleet-timeline failure seen with it on is explained (CHANGELOG, Known issues)."""
    ui_port: int = 8233
    metrics_port: int = 9464
    """The controller serves Prometheus text format at ``http://0.0.0.0:PORT/metrics``
    (CONTRACT.md §5.4); ``0`` turns it off. Several controllers on one host need one each."""
    sdk_metrics_port: int = 9465
    """The Temporal SDK's own metrics (workflow and activity task latencies, slots, polls) in
    Prometheus text format at ``http://0.0.0.0:PORT/metrics``; ``0`` turns them off."""
    controllers: int = Field(default_factory=lambda: controllers_for(os.cpu_count()))
    """``REAPER_CONTROLLERS``: how many controller processes ``reaper run`` starts (replicas
    on one task queue; process K serves metrics on both ports + 2(K-1), logs to
    ``{state_dir}/logs/controller-K.log``). Default one per two cores, at least one
    (``config_values.controllers_for``): on 2 busy cores a second process took CPU from
    Temporal (0.67-0.69 cores against 0.52-0.55) and ran fewer workflow tasks (51-58/s
    against 57-64; bench metric 4, docs/capacity.md "Controller processes per host")."""

    @model_validator(mode="after")
    def _check_relations(self) -> Settings:
        if self.heartbeat_interval <= 0:
            raise ValueError("REAPER_HEARTBEAT_INTERVAL must be greater than 0")
        if self.stall_after < 2 * self.heartbeat_interval:
            raise ValueError(
                "REAPER_STALL_AFTER must be at least 2 * REAPER_HEARTBEAT_INTERVAL "
                f"({self.stall_after:g}s < 2 * {self.heartbeat_interval:g}s)"
            )
        if self.lost_after <= self.stall_after:
            raise ValueError(
                "REAPER_LOST_AFTER must be greater than REAPER_STALL_AFTER "
                f"({self.lost_after:g}s <= {self.stall_after:g}s)"
            )
        if self.missing_ttl < 3 * self.heartbeat_interval:
            raise ValueError(
                "REAPER_MISSING_TTL must be at least 3 * REAPER_HEARTBEAT_INTERVAL "
                f"({self.missing_ttl:g}s < 3 * {self.heartbeat_interval:g}s)"
            )
        if not 0 < self.disruption_threshold <= 1:
            raise ValueError(
                f"REAPER_DISRUPTION_THRESHOLD must be in (0, 1], got {self.disruption_threshold:g}"
            )
        if self.drain_deadline < 2 * self.heartbeat_interval:
            raise ValueError(
                "REAPER_DRAIN_DEADLINE must be at least 2 * REAPER_HEARTBEAT_INTERVAL "
                f"({self.drain_deadline:g}s < 2 * {self.heartbeat_interval:g}s)"
            )
        if self.retire_after < self.lost_after:
            raise ValueError(
                "REAPER_RETIRE_AFTER must be at least REAPER_LOST_AFTER "
                f"({self.retire_after:g}s < {self.lost_after:g}s)"
            )
        if self.resync_interval < self.heartbeat_interval:
            raise ValueError(
                "REAPER_RESYNC_INTERVAL must be at least REAPER_HEARTBEAT_INTERVAL "
                f"({self.resync_interval:g}s < {self.heartbeat_interval:g}s)"
            )
        if self.full_resync_interval < self.resync_interval:
            raise ValueError(
                "REAPER_FULL_RESYNC_INTERVAL must be at least REAPER_RESYNC_INTERVAL "
                f"({self.full_resync_interval:g}s < {self.resync_interval:g}s)"
            )
        if not 0 < self.max_drop_fraction <= 1:
            raise ValueError(
                f"REAPER_MAX_DROP_FRACTION must be in (0, 1], got {self.max_drop_fraction:g}"
            )
        if self.reap_rate <= 0:
            raise ValueError(f"REAPER_REAP_RATE must be greater than 0, got {self.reap_rate:g}")
        if self.operator_keys_file:
            try:
                text = Path(self.operator_keys_file).read_text()
            except OSError as exc:
                raise ValueError(
                    f"REAPER_OPERATOR_KEYS_FILE: cannot read {self.operator_keys_file}: "
                    f"{exc.strerror}"
                ) from None
            lines = [line.split("#", 1)[0] for line in text.splitlines()]
            try:
                extra = parse_keys(" ".join(lines))
            except ValueError as exc:
                raise ValueError(f"REAPER_OPERATOR_KEYS_FILE: {exc}") from None
            self.operator_keys = tuple(dict.fromkeys(self.operator_keys + extra))
        if not rollout.known_line(self.peer_version):
            raise ValueError(
                "REAPER_PEER_VERSION must be one of "
                f"{', '.join(rollout.RELEASE_LINES)}, got {self.peer_version!r}"
            )
        if self.sticky_timeout <= 0:
            raise ValueError(
                f"REAPER_STICKY_TIMEOUT must be greater than 0, got {self.sticky_timeout:g}"
            )
        if self.workflow_task_pollers < 2:
            raise ValueError(
                "REAPER_WORKFLOW_TASK_POLLERS must be at least 2 (one for the shared queue, one "
                f"for the sticky queue), got {self.workflow_task_pollers}"
            )
        if self.workflow_cache < 1:
            raise ValueError(f"REAPER_WORKFLOW_CACHE must be at least 1, got {self.workflow_cache}")
        if self.reap_burst < 1:
            raise ValueError(f"REAPER_REAP_BURST must be at least 1, got {self.reap_burst}")
        for name, port in (
            ("METRICS_PORT", self.metrics_port),
            ("SDK_METRICS_PORT", self.sdk_metrics_port),
        ):
            if not 0 <= port <= 65535:
                raise ValueError(f"REAPER_{name} must be a TCP port (0 turns it off), got {port}")
        if self.metrics_port and self.metrics_port == self.sdk_metrics_port:
            raise ValueError(
                "REAPER_SDK_METRICS_PORT must differ from REAPER_METRICS_PORT "
                f"({self.metrics_port})"
            )
        if self.controllers < 1:
            raise ValueError(f"REAPER_CONTROLLERS must be at least 1, got {self.controllers}")
        try:
            process_ports(self.metrics_port, self.sdk_metrics_port, self.controllers)
        except ValueError as exc:
            raise ValueError(f"REAPER_CONTROLLERS: {exc}") from None
        return self


def load_settings(**overrides: Any) -> Settings:
    """Build settings from the environment, a ``.env`` file and ``overrides`` (flags win).

    Args:
        overrides: field names of :class:`Settings` to values; ``None`` values are ignored.

    Returns:
        The validated settings.

    Raises:
        ConfigError: one line naming the offending ``REAPER_*`` variable and why.
    """
    return _load(Settings, overrides)


def load_connection_settings(**overrides: Any) -> ConnectionSettings:
    """:func:`load_settings` for :class:`ConnectionSettings`: no controller timing is read
    or checked.

    Raises:
        ConfigError: one line naming the offending ``REAPER_*`` variable and why.
    """
    return _load(ConnectionSettings, overrides)


def _load(cls: type[SettingsT], overrides: dict[str, Any]) -> SettingsT:
    clean = {k: v for k, v in overrides.items() if v is not None}
    try:
        return cls(**clean)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = first.get("loc") or ()
        msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        if loc:
            raise ConfigError(f"REAPER_{str(loc[0]).upper()}: {msg}") from None
        raise ConfigError(msg) from None
