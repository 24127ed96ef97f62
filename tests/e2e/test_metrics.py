"""Prometheus metrics (CONTRACT.md §5.4) scraped from two real controller processes sharing one
task queue and one database, with heartbeating workers on a real dev server.

Fleet gauges come from Postgres, so both replicas show the same fleet; counters count what
each process did, so the sum over the replicas equals what happened (events rows).
"""

from __future__ import annotations

import asyncio
import urllib.request
import uuid

from prometheus_client.parser import text_string_to_metric_families

from reaper import __version__
from reaper.kit.processes import free_port
from tests.support.agents import Agents
from tests.support.controller import ControllerProcess
from tests.support.heartbeats import beat, send
from tests.support.polling import eventually

FAST = {
    "REAPER_HEARTBEAT_INTERVAL": "1s",
    "REAPER_STALL_AFTER": "2s",
    "REAPER_LOST_AFTER": "5s",
    "REAPER_MISSING_TTL": "4s",
    "REAPER_RESYNC_INTERVAL": "1s",
}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _get(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        return resp.read().decode()


async def scrape(port: int) -> Samples:
    """Every sample of ``/metrics`` on ``port``, keyed by (name, labels); ``{}`` while the
    endpoint is not up yet."""
    try:
        text = await asyncio.to_thread(_get, port)
    except OSError:
        return {}
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def workers(samples: Samples) -> tuple[float | None, ...]:
    """``reaper_workers{state}`` for running, stalled, lost."""
    return tuple(value(samples, "reaper_workers", state=s) for s in ("running", "stalled", "lost"))


async def total(ports: list[int], name: str, **labels: str) -> float:
    """A counter summed over the replicas (each counts what it did)."""
    got = [value(await scrape(p), name, **labels) for p in ports]
    return sum(v or 0.0 for v in got)


async def test_metrics_of_two_replicas(dev_env, db_url, pool, tmp_path):
    client = dev_env.client
    address = client.service_client.config.target_host
    sfx = uuid.uuid4().hex[:6]
    a, b = f"a-{sfx}", f"b-{sfx}"
    await pool.execute("INSERT INTO reaper.services (name, desired_count) VALUES ('web', 2)")
    await pool.execute(
        "INSERT INTO reaper.tasks (id, service, worker, state) VALUES"
        " ('t-a', 'web', $1, 'running'), ('t-b', 'web', $2, 'running')",
        a,
        b,
    )
    await pool.execute(
        "INSERT INTO reaper.volumes (handle, worker) VALUES ('v-kept', $1), ('v-gone', $1)", a
    )
    ports = [free_port(), free_port()]
    sdk_port = free_port()
    first = ControllerProcess(
        address,
        db_url,
        tmp_path / "controller-1.log",
        {**FAST, "REAPER_METRICS_PORT": str(ports[0]), "REAPER_SDK_METRICS_PORT": str(sdk_port)},
    )
    second = ControllerProcess(
        address,
        db_url,
        tmp_path / "controller-2.log",
        {**FAST, "REAPER_METRICS_PORT": str(ports[1])},
    )
    second.env["REAPER_TASK_QUEUE"] = first.task_queue
    tq = first.task_queue
    first.start()
    second.start()
    try:
        with Agents(client, tq) as agents:
            agents.reports = {a: {"volumes": ["v-kept"], "tasks": ["t-a"]}, b: {"tasks": ["t-b"]}}
            # Fleet gauges: both workers running, the same on both replicas.
            for port in ports:
                got = await eventually(
                    lambda p=port: scrape(p),
                    lambda s: workers(s) == (2, 0, 0),
                    timeout=60,
                    poll=0.2,
                    what=f"2 workers running on :{port}",
                )
                assert value(got, "reaper_fleet_disruption") == 0
                # The release it runs (CHANGELOG.md), as `reaper --version` says it.
                assert value(got, "reaper_build_info", version=__version__) == 1
                assert value(got, "reaper_replacements_owed") == 0
                assert value(got, "reaper_destroyed_total", kind="container") == 0
                assert value(got, "reaper_worker_last_heartbeat_timestamp_seconds", worker=a)
            # Neither agent reports containers (a: volumes and tasks; b: tasks): both beat
            # liveness only for that kind, past RESYNC_INTERVAL, on both replicas (issue 35).
            for port in ports:
                await eventually(
                    lambda p=port: scrape(p),
                    lambda s: value(s, "reaper_workers_reports_incomplete") == 2,
                    timeout=30,
                    poll=0.2,
                    what=f"2 workers reporting liveness only on :{port}",
                )

            # A heartbeat sent to another worker's liveness is rejected, and counted once.
            assert await total(ports, "reaper_heartbeats_rejected_total") == 0
            await send(client, tq, beat(f"intruder-{sfx}", 1), worker=a)
            await eventually(
                lambda: total(ports, "reaper_heartbeats_rejected_total"),
                lambda n: n == 1,
                timeout=30,
                poll=0.2,
                what="one rejected heartbeat counted",
            )

            # v-gone, missing from a's reports for MISSING_TTL, is destroyed: counted once.
            await eventually(
                lambda: total(ports, "reaper_destroyed_total", kind="volume"),
                lambda n: n == 1,
                timeout=60,
                poll=0.2,
                what="one destroyed volume counted",
            )
            assert await pool.fetchval(
                "SELECT array_agg(handle) FROM reaper.events WHERE action = 'destroyed'"
            ) == ["v-gone"]
            assert await total(ports, "reaper_reconcile_duration_seconds_count", kind="volume") > 0

            # b goes silent: lost and reaped; 1 of 2 unhealthy is below 0.55 (partial).
            del agents.reports[b]
            for port in ports:
                got = await eventually(
                    lambda p=port: scrape(p),
                    lambda s: workers(s) == (1, 0, 1) and value(s, "reaper_fleet_disruption") == 1,
                    timeout=60,
                    poll=0.2,
                    what=f"b lost on :{port}",
                )
                lag = value(got, "reaper_heartbeat_lag_max_seconds", state="lost")
                assert lag is not None and lag >= 5
            await eventually(
                lambda: total(ports, "reaper_tasks_reaped_total"),
                lambda n: n == 1,
                timeout=60,
                poll=0.2,
                what="t-b reaped and counted",
            )
            assert await pool.fetchval("SELECT state FROM reaper.tasks WHERE id = 't-b'") == "lost"
            # kept beside the logs for a reader (pytest --basetemp)
            (tmp_path / "metrics.txt").write_text(await asyncio.to_thread(_get, ports[0]))

        # The Temporal SDK's own series on the second port of the first controller.
        sdk = await eventually(
            lambda: scrape(sdk_port), bool, timeout=30, poll=0.2, what="SDK metrics"
        )
        assert any(name.startswith("temporal_") for name, _ in sdk), sorted(sdk)[:10]
    finally:
        for proc in (first, second):
            proc.stop()


def summed(samples: Samples, prefix: str) -> float:
    """The samples whose name starts with ``prefix``, over all their labels (the SDK labels
    its series by namespace, task queue and worker type)."""
    return sum(v for (name, _), v in samples.items() if name.startswith(prefix))


async def test_a_controller_caches_at_most_its_workflow_cache(dev_env, db_url, pool, tmp_path):
    """``REAPER_WORKFLOW_CACHE`` bounds the runs a controller keeps in memory (the SDK's
    ``max_cached_workflows``): with 2, three workers' six workflows and the fleet monitor
    take turns in the cache (evicted, replayed at their next task), and the workers stay
    registered and beating."""
    client = dev_env.client
    sdk_port = free_port()
    ctl = ControllerProcess(
        client.service_client.config.target_host,
        db_url,
        tmp_path / "controller.log",
        {
            **FAST,
            "REAPER_LOST_AFTER": "60s",
            "REAPER_SDK_METRICS_PORT": str(sdk_port),
            "REAPER_WORKFLOW_CACHE": "2",
        },
    )
    names = [f"cache-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    ctl.start()
    try:
        with Agents(client, ctl.task_queue) as agents:
            agents.reports = {n: {} for n in names}
            await eventually(
                lambda: pool.fetchval(
                    "SELECT count(*) FROM reaper.workers WHERE name = ANY($1) AND last_seq >= 3",
                    names,
                ),
                lambda n: n == len(names),
                timeout=60,
                poll=0.2,
                what="three workers registered and beating",
            )
            sdk = await eventually(
                lambda: scrape(sdk_port),
                lambda s: summed(s, "temporal_sticky_cache_total_forced_eviction") > 0,
                timeout=30,
                poll=0.2,
                what="runs evicted from a full cache",
            )
            assert 0 < summed(sdk, "temporal_sticky_cache_size") <= 2, ctl.tail()
    finally:
        ctl.stop()
