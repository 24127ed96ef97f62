"""The Temporal Web UI, checked in a real browser (headless Chromium driven by Playwright).

A dev server with its Web UI, Postgres and a controller process; three simulated agents, one
of which falls silent and is lost. Then, as an operator would: the workflows list filtered
by ``ReaperState="lost"`` (the operator guide's ready-made link) shows exactly the lost worker's
liveness, with the ``Reaper*`` columns added through "Configure Workflows Table"; the
liveness's page shows its worker, state, last heartbeat and missing count (its current
details). Screenshots are kept under ``.reaper/artifacts/web-ui/`` (gitignored); two of them
are in docs/images/.

Debian's ``/usr/bin/chromium`` (``make sysdeps``) is driven, never a browser Playwright
downloads. The page is waited on by selector and text: ``--virtual-time-budget`` never
settles on these pages (they keep a request open, docs/platform-notes.md).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import pytest_asyncio
from playwright.async_api import Browser, async_playwright, expect
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError

from reaper.core.contract import StateView, liveness_id
from reaper.kit.processes import free_port
from reaper.kit.temporal import DevServer
from tests.support.agents import Agents
from tests.support.controller import ControllerProcess
from tests.support.heartbeats import query_state
from tests.support.paths import ROOT
from tests.support.polling import eventually
from workflows.view import utc

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / ".reaper" / "artifacts" / "web-ui"
FAST = {
    "REAPER_HEARTBEAT_INTERVAL": "1s",
    "REAPER_STALL_AFTER": "2s",
    "REAPER_LOST_AFTER": "5s",
    # Long enough that the missing volume is still missing (not destroyed) when looked at.
    "REAPER_MISSING_TTL": "10m",
    "REAPER_RESYNC_INTERVAL": "1s",
}
WAIT_MS = 30_000
"""Deadline of each wait on the page: generous, for a loaded 2-core machine."""

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.own_stack,
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK),
        reason=f"{CHROMIUM} not found: `make sysdeps` installs Debian's chromium package",
    ),
]


def list_url(ui: str, query: str) -> str:
    """The Web UI's workflows list filtered by a visibility ``query`` (the guide's links)."""
    return f"{ui}/namespaces/default/workflows?query={quote(query, safe='')}"


@dataclass
class WebStack:
    ui_url: str
    client: Client
    controller: ControllerProcess


async def connect(address: str) -> Client | None:
    """A client of the dev server at ``address``; ``None`` while its frontend is starting
    (its port accepts connections before it reports healthy)."""
    try:
        return await Client.connect(address, data_converter=pydantic_data_converter)
    except RuntimeError:
        return None


@pytest_asyncio.fixture
async def web_stack(db_url: str, tmp_path: Path) -> AsyncIterator[WebStack]:
    """A dev server with its Web UI, a controller process on it, and a client."""
    server = DevServer(
        tmp_path / "temporal.log", db_file=tmp_path / "temporal.db", ui_port=free_port()
    )
    await server.up()
    controller = ControllerProcess(server.address, db_url, tmp_path / "controller.log", FAST)
    try:
        client = await eventually(
            lambda: connect(server.address), bool, timeout=60, poll=0.2, what="a healthy frontend"
        )
        assert client is not None
        controller.start()
        assert server.ui_url is not None
        yield WebStack(server.ui_url, client, controller)
    finally:
        controller.stop()
        server.stop()


async def state_of(client: Client, worker: str) -> StateView | None:
    """``worker``'s ``state`` query answer; ``None`` before its first beat started it."""
    try:
        return await query_state(client, worker)
    except RPCError:
        return None


async def visible_ids(client: Client, query: str) -> list[str]:
    """Ids of the workflows a visibility ``query`` lists (what the Web UI's list shows)."""
    return sorted([wf.id async for wf in client.list_workflows(query)])


def shot(name: str) -> Path:
    """Where screenshot ``name`` goes (printed: pytest shows it with a failure)."""
    path = ARTIFACTS / name
    print(f"screenshot: {path}")
    return path


VIEWS = ROOT / "deploy" / "web-ui" / "reaper-views.js"


async def with_views_set_up(browser: Browser, ui: str, lost_query: str, alive: str, lost: str):
    """The operator guide's one-time set-up (deploy/web-ui/reaper-views.js pasted into the
    console of a fresh browser profile), then the plain workflows list: each worker's state
    in its row, no Status badge, and the saved views ready (issue 35)."""
    context = await browser.new_context(viewport={"width": 1440, "height": 760})
    page = await context.new_page()
    page.set_default_timeout(WAIT_MS)
    try:
        await page.goto(f"{ui}/namespaces/default/workflows")
        said = await page.evaluate(VIEWS.read_text())
        assert said.startswith("reaper's columns and 6 saved views set for namespace default")
        await page.reload()
        rows = page.get_by_test_id("workflows-summary-configurable-table-row")
        row_of = {w: rows.filter(has_text=liveness_id(w)) for w in (alive, lost)}
        await expect(row_of[lost]).to_contain_text("lost", timeout=WAIT_MS)
        await expect(row_of[alive]).to_contain_text("running", timeout=WAIT_MS)
        for w, locator in row_of.items():
            await expect(locator).not_to_contain_text("RUNNING", timeout=WAIT_MS)  # no badge
            await expect(locator).to_contain_text(w, timeout=WAIT_MS)  # ReaperWorker
        headers = page.get_by_test_id("workflows-summary-table-header-cell-Status")
        await expect(headers).to_have_count(0)
        # A saved view is one click: "reaper: workers" lists the running livenesses, each
        # with its worker's state; "reaper: lost" the lost worker only.
        for view, count in (("reaper: workers", 3), ("reaper: lost", 1)):
            await page.get_by_test_id("saved-views-button").click()
            await page.get_by_text(view, exact=True).first.click()
            await expect(rows).to_have_count(count, timeout=WAIT_MS)
            if view == "reaper: workers":
                await expect(rows.filter(has_text=liveness_id(lost))).to_contain_text("lost")
                await page.screenshot(
                    path=shot("workflows-states.png"),
                    clip={"x": 0, "y": 0, "width": 1440, "height": 400},
                )
        await expect(page).to_have_url(re.compile(re.escape(quote(lost_query, safe=""))))
        await expect(rows.first).to_contain_text(liveness_id(lost), timeout=WAIT_MS)
    except BaseException:
        await page.screenshot(path=shot("views-failure.png"))
        (ARTIFACTS / "views-failure.txt").write_text(await page.inner_text("body"))
        raise
    finally:
        await context.close()


async def test_web_ui_lists_the_lost_worker_and_shows_its_liveness(web_stack, pool, capsys):
    shutil.rmtree(ARTIFACTS, ignore_errors=True)  # this run's screenshots only
    ARTIFACTS.mkdir(parents=True)
    client, tq = web_stack.client, web_stack.controller.task_queue
    sfx = uuid.uuid4().hex[:4]
    a, b, c = f"web-a-{sfx}", f"web-b-{sfx}", f"web-c-{sfx}"
    await pool.execute(
        "INSERT INTO reaper.volumes (handle, worker) VALUES ('v-1', $1), ('v-2', $1)", c
    )
    with Agents(client, tq) as agents:
        agents.reports = {a: {"volumes": []}, b: {"volumes": []}, c: {"volumes": ["v-1"]}}
        await eventually(
            lambda: state_of(client, c),
            lambda s: s is not None and s.state == "running" and s.missing == 1,
            timeout=90,
            poll=0.2,
            what=f"{c} running, v-2 missing",
        )
        del agents.reports[c]  # c falls silent: stalled after 2 s, lost after 5 s
        lost = await eventually(
            lambda: query_state(client, c),
            lambda s: s.state == "lost",
            timeout=60,
            poll=0.2,
            what=f"{c} lost",
        )
        lost_query = 'ReaperState="lost"'
        await eventually(
            lambda: visible_ids(client, lost_query),
            lambda ids: ids == [liveness_id(c)],
            timeout=30,
            poll=0.2,
            what=f"visibility lists only {c} as lost",
        )

        async with async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=CHROMIUM,
                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
            )
            page = await browser.new_page(viewport={"width": 1440, "height": 760})
            page.set_default_timeout(WAIT_MS)
            try:
                await page.goto(list_url(web_stack.ui_url, lost_query))
                rows = page.get_by_test_id("workflows-summary-configurable-table-row")
                await expect(rows).to_have_count(1, timeout=WAIT_MS)
                await expect(rows.first).to_contain_text(liveness_id(c), timeout=WAIT_MS)

                await page.get_by_role("button", name="Collapse Navigation").click()
                # The operator guide's recipe: Configure Workflows Table, add the Reaper* columns.
                await page.get_by_test_id("workflows-summary-table-configuration-button").click()
                for column in ("ReaperWorker", "ReaperState", "ReaperMissing"):
                    await page.get_by_test_id(f"orderable-list-item-{column}-add-button").click()
                for column in ("Run ID", "End"):
                    await page.get_by_test_id(f"orderable-list-item-{column}-remove-button").click()
                await page.get_by_test_id("drawer-close-button").click()
                await expect(page.get_by_text("Configure Workflows Table")).to_be_hidden()
                # The browser keeps the columns: a reload still shows the worker as lost.
                await page.reload()
                await expect(rows).to_have_count(1, timeout=WAIT_MS)
                await expect(rows.first).to_contain_text(c, timeout=WAIT_MS)
                await expect(rows.first).to_contain_text("lost", timeout=WAIT_MS)
                await page.screenshot(
                    path=shot("workflows-lost.png"),
                    clip={"x": 0, "y": 0, "width": 1440, "height": 340},
                )

                # The liveness's page: its current details, kept live by the workflow.
                await rows.first.get_by_role("link", name=liveness_id(c)).click()
                # Web UI 2.54 shows them under User Metadata, rendered in a frame.
                await page.get_by_text("User Metadata", exact=True).click()
                details = page.frame_locator("iframe#user-metadata-current-details")
                heartbeat = f"{utc(lost.last_heartbeat_at)} (seq {lost.last_seq})"
                for text in (
                    f"worker: {c}",
                    f"state: lost since {utc(lost.state_since)}",
                    f"last heartbeat: {heartbeat}",
                    "missing: 1 (volumes 1)",
                ):
                    await expect(details.get_by_text(text)).to_be_visible(timeout=WAIT_MS)
                await page.screenshot(
                    path=shot("liveness-lost.png"),
                    clip={"x": 0, "y": 0, "width": 1440, "height": 650},
                )
                await with_views_set_up(browser, web_stack.ui_url, lost_query, a, c)
            except BaseException:
                await page.screenshot(path=shot("failure.png"))
                (ARTIFACTS / "failure.txt").write_text(await page.inner_text("body"))
                print(f"controller log:\n{web_stack.controller.tail()}")
                raise
            finally:
                await browser.close()
    with capsys.disabled():
        print("\nWeb UI screenshots:", *sorted(str(p) for p in ARTIFACTS.glob("*.png")))
