"""Calls to a Docker Engine API (Docker, or Podman's compatible service) from the asyncio
agent: the sync docker-py client in a thread, every call bounded, the engine's health
followed.

docker-py (the ``docker`` package, pinned in pyproject.toml) is the Docker project's own
Python client: it speaks the Engine API over a unix socket and maps errors to
``docker.errors`` (``NotFound``, ``APIError`` with the status); the API version is
negotiated here (:func:`negotiate`). It is synchronous, so each call runs in
:func:`asyncio.to_thread` under :func:`asyncio.wait_for`; the client's own HTTP timeout is
the same, so a thread left behind by a timed-out call ends soon after.

An engine is *up* while it answers, with data or with a client error (404, 409: answers
about one object); it is *down* when it cannot be reached, times out, or answers a server
error (5xx). The agent logs one line per change between the two, and the
``reaper_agent_engine_up`` gauge follows.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions
from docker.constants import DEFAULT_DOCKER_API_VERSION, MINIMUM_DOCKER_API_VERSION
from docker.utils import version_lt

from reaper.cli.agent_connection import short_error
from reaper.cli.agent_metrics import AgentMetrics

log = logging.getLogger("reaper.agent")

T = TypeVar("T")


class EngineDown(Exception):
    """The engine did not answer: unreachable, too slow, or a server error (5xx)."""


def _why(exc: BaseException, deadline_s: float) -> str:
    """Why a call got no answer, in a few words."""
    if isinstance(exc, TimeoutError | requests.exceptions.Timeout):
        return f"no answer within {deadline_s:g}s"
    text = str(exc)
    if "No such file or directory" in text:
        return "no socket there"
    if "Connection refused" in text:
        return "connection refused"
    return short_error(exc)


def negotiate(url: str, timeout: float) -> docker.APIClient:
    """A client of the engine at ``url`` speaking the highest API version both know.

    The version comes from the ``Api-Version`` header of ``/_ping`` (as the docker CLI
    does), capped at docker-py's own default: docker-py's ``version="auto"`` asks
    ``/version`` instead, which Podman 4 answers in over a second (it runs its helpers to
    report their versions), longer than an agent's call may take.

    Raises:
        requests.exceptions.RequestException: no answer, or an error answer.
    """
    whole = math.ceil(timeout)  # docker-py's type; requests takes any
    probe = docker.APIClient(base_url=url, version=MINIMUM_DOCKER_API_VERSION, timeout=whole)
    try:
        answer = probe.get(f"{probe.base_url}/_ping", timeout=timeout)
        answer.raise_for_status()
        version = answer.headers.get("Api-Version") or MINIMUM_DOCKER_API_VERSION
    finally:
        probe.close()
    if version_lt(DEFAULT_DOCKER_API_VERSION, version):
        version = DEFAULT_DOCKER_API_VERSION
    return docker.APIClient(base_url=url, version=version, timeout=whole)


def is_gone(exc: docker.errors.APIError) -> bool:
    """The error says the object is not there (any more): a 404, or Podman's 500 "no such
    container" for one it is removing at that moment."""
    text = str(exc.explanation or "").lower()
    return (
        isinstance(exc, docker.errors.NotFound)
        or "no such container" in text
        or ("no such volume" in text)
    )


class Engine:
    """One Engine API endpoint, called with a deadline; its health followed.

    Args:
        url: the API's address, ``unix:///run/podman/podman.sock`` or
            ``unix:///var/run/docker.sock`` (docker-py's ``base_url``).
        timeout: seconds one call may take (plus a stop's grace period), at least 0.5.
        metrics: where ``reaper_agent_engine_up`` is set.
    """

    def __init__(self, url: str, timeout: float, metrics: AgentMetrics) -> None:
        self.url = url
        self.timeout = max(0.5, timeout)
        self.metrics = metrics
        self.up: bool | None = None
        """True while it answers, False while it does not, None before the first call."""
        self._api: docker.APIClient | None = None
        self._down_since: float | None = None

    def _client(self) -> docker.APIClient:
        """The client, made on first use with the API version :func:`negotiate` finds."""
        if self._api is None:
            self._api = negotiate(self.url, self.timeout)
        return self._api

    async def call(
        self,
        what: str,
        fn: Callable[..., T],
        *args: Any,
        extra_s: float = 0,
        judge: bool = False,
        **kwargs: Any,
    ) -> T:
        """Run ``fn(client, *args, **kwargs)`` in a thread within ``timeout + extra_s``
        seconds; ``fn`` is a method of ``docker.APIClient`` (``APIClient.stop``).

        Args:
            what: the call, for the log (``list containers``).
            extra_s: more time for calls that wait on purpose (a stop's grace period).
            judge: a call that judges the engine's health (the lists): a 5xx answer marks
                it down. To a call about one object (create, start, stop, remove) a 5xx is
                that object's failure (Podman answers 500 when the OCI runtime fails).

        Raises:
            EngineDown: unreachable, timed out, or (``judge``) a 5xx answer; the engine is
                marked down.
            docker.errors.APIError: an error answer about one object (``NotFound``, 409).
        """
        try:
            result = await asyncio.wait_for(
                asyncio.to_thread(lambda: fn(self._client(), *args, **kwargs)),
                timeout=self.timeout + extra_s + 1,
            )
        except docker.errors.APIError as exc:
            status = exc.status_code
            if not judge or (status is not None and status < 500):
                self._answered()
                raise
            self._failed(what, f"HTTP {status}: {exc.explanation or exc}")
            raise EngineDown(what) from exc
        except (
            TimeoutError,
            requests.exceptions.RequestException,
            docker.errors.DockerException,
            OSError,
        ) as exc:
            self._api = None  # negotiate again once it is back: it may be another engine
            self._failed(what, _why(exc, self.timeout + extra_s))
            raise EngineDown(what) from exc
        self._answered()
        return result

    def _answered(self) -> None:
        if self.up is not True:
            if self._down_since is None:
                api = self._api.api_version if self._api is not None else "?"
                log.info("container engine at %s answers (API %s)", self.url, api)
            else:
                log.info(
                    "container engine at %s answers again after %.1fs; complete reports resume",
                    self.url,
                    time.monotonic() - self._down_since,
                )
            self._down_since = None
        self.up = True
        self.metrics.engine_up.set(1)

    def _failed(self, what: str, why: str) -> None:
        if self.up is not False:
            log.warning(
                "container engine at %s not answering (%s: %s); heartbeats report liveness "
                "only and nothing is started or removed until it answers",
                self.url,
                what,
                why,
            )
            self._down_since = time.monotonic()
        self.up = False
        self.metrics.engine_up.set(0)

    def close(self) -> None:
        """Close the client's connections (the next call opens new ones)."""
        if self._api is not None:
            self._api.close()
            self._api = None
