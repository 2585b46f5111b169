"""The training view on a real run: three steps of a trainer through the real rollout service
(groups kept and dropped, token-in bridges and breaks, weight updates, one batch sampled a
version behind, figures posted with `client.post_metrics`; tests/support/training_run.py).
Its numbers are checked against the run's report over HTTP and in the real browser, which
leaves a screenshot of the page (the `screenshots` fixture)."""

from __future__ import annotations

import asyncio
import html
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from rolltap.store import Store
from rolltap.ui import UIContext, UISettings, make_app
from tests.support.processes import free_port
from tests.support.training_run import make_training_run, posted_metrics
from tests.ui.conftest import FakeEngineTexts, browser_missing

ClientMaker = Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]]
Client = TestClient[web.Request, web.Application]

BRIDGE_BREAK_RATES = [2 / 6, 0.0, 2 / 4]
"""Per step: the `edit` task's second calls break (2 of 6 continuing calls, none, 2 of 4)."""
STALENESS = [(0.0, 0), (0.0, 0), (1.0, 1)]
"""Per step: (mean, max) versions behind the batch's policy version."""


@pytest.fixture(scope="module")
def training_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """A SQLite store holding the run, and its report."""
    folder = tmp_path_factory.mktemp("training-run")
    url = f"sqlite:///{folder / 'store.sqlite'}"

    async def make() -> dict[str, Any]:
        store = await Store.connect(url)
        try:
            return await make_training_run(store, folder / "logs")
        finally:
            await store.close()

    return url, asyncio.run(make())


@pytest.fixture
async def viewer(
    training_run: tuple[str, dict[str, Any]], aiohttp_client: ClientMaker
) -> AsyncIterator[Client]:
    url, _ = training_run
    store = await Store.connect(url, read_only=True)
    try:
        yield await aiohttp_client(make_app(UIContext(store, UISettings(), FakeEngineTexts())))
    finally:
        await store.close()


def _expected(it: dict[str, Any], step: int) -> dict[str, Any]:
    """What the view must show for one iteration of the report."""
    rewards = [r for r in it["rewards"] if r is not None]
    posted = posted_metrics(it)
    return {
        "samples": len(it["rewards"]),
        "mean_reward": sum(rewards) / len(rewards),
        "kept": it["groups"],
        "dropped": it["dropped"],
        "calls": 2 * len(it["rewards"]),
        "staleness_mean": STALENESS[step][0],
        "staleness_max": STALENESS[step][1],
        "off_policy": float(STALENESS[step][1] > 0),
        "bridge_break_rate": BRIDGE_BREAK_RATES[step],
        "mismatch_max": posted["logprob_mismatch_max"],
        "mismatch_mean": posted["logprob_mismatch_mean"],
    }


def _cells(page: str, version: str) -> dict[str, str]:
    """The version's cells by metric, from both of its rows (sampling, the trainer's)."""
    rows = re.findall(rf'<tr data-version="{re.escape(version)}">(.*?)</tr>', page, re.S)
    assert len(rows) == 2, version
    return dict(re.findall(r'data-metric="(\w+)" data-value="([^"]*)"', "".join(rows)))


async def test_the_run_per_policy_version_over_http(
    viewer: Client, training_run: tuple[str, dict[str, Any]]
) -> None:
    _, report = training_run
    index = await (await viewer.get("/training")).text()
    assert f'href="/training?session={report["session"]}"' in index
    assert "run=fake-grpo · 3" in html.unescape(index)

    resp = await viewer.get(f"/training?session={report['session']}")
    page = await resp.text()
    assert resp.status == 200, page
    for step, it in enumerate(report["iterations"]):
        cells = _cells(page, it["policy_version"])
        for name, value in _expected(it, step).items():
            assert float(cells[name]) == pytest.approx(value), (it["step"], name)
        assert f'href="/batches/{it["batch_id"]}"' in page
    # One point per version and series where there is a value.
    assert page.count('data-series="mean reward"') == 3
    assert page.count('data-series="bridge break rate"') == 3
    assert page.count('data-part="dropped: uninformative"') == 2


async def test_a_label_picks_its_batches_and_a_bad_query_is_refused(viewer: Client) -> None:
    page = await (await viewer.get("/training?label=run=fake-grpo&label=step=2")).text()
    assert re.findall(r'<tr data-version="([^"]+)">', page) == ["1", "1"]
    page = await (await viewer.get("/training?batch=fake-grpo-3&batch=fake-grpo-1")).text()
    assert re.findall(r'<tr data-version="([^"]+)">', page) == ["0", "3", "0", "3"]
    nothing = await (await viewer.get("/training?label=run=other")).text()
    assert "No batch matches run=other" in nothing
    bad = await viewer.get("/training?label=nokey")
    assert bad.status == 400
    assert "key=value" in await bad.text()
    batches = await (await viewer.get("/")).text()
    assert 'href="/training"' in batches


@pytest.fixture(scope="module")
def ui_url(training_run: tuple[str, dict[str, Any]]) -> Iterator[str]:
    """`rolltap ui` on the run's store, as its own process."""
    reason = browser_missing()
    if reason is not None:
        pytest.skip(reason)
    url, _ = training_run
    port = free_port()
    command = [sys.executable, "-m", "rolltap.cli.main", "ui", "--db", url, "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(base, process)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


def wait_for(base: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(base + "/", timeout=5):
                return
        except OSError:
            assert process.poll() is None, "rolltap ui exited"
            assert time.monotonic() < deadline, "rolltap ui did not start"
            time.sleep(0.1)


def test_the_training_view_in_the_browser(
    browser: Any, ui_url: str, training_run: tuple[str, dict[str, Any]], screenshots: Path
) -> None:
    _, report = training_run
    check_training_view(browser, ui_url, report, screenshots, "training")


def check_training_view(
    browser: Any, base: str, report: dict[str, Any], screenshots: Path, name: str
) -> None:
    """Open the run from the batches page as a person would and compare every row's numbers
    with the report's iteration for that policy version."""
    from selenium.webdriver.common.by import By

    browser.set_window_size(1400, 1000)
    browser.get(base + "/")
    browser.find_element(By.LINK_TEXT, "training runs →").click()
    browser.find_element(
        By.CSS_SELECTOR, f'a[href="/training?session={report["session"]}"]'
    ).click()
    rows = browser.find_elements(By.CSS_SELECTOR, "table.sampling tbody tr")
    assert [r.get_attribute("data-version") for r in rows] == [
        it["policy_version"] for it in report["iterations"]
    ]
    posted_rows = browser.find_elements(By.CSS_SELECTOR, "table.posted tbody tr")
    for step, (row, posted_row, it) in enumerate(
        zip(rows, posted_rows, report["iterations"], strict=True)
    ):
        assert posted_row.get_attribute("data-version") == it["policy_version"]
        cells = {
            c.get_attribute("data-metric"): c
            for r in (row, posted_row)
            for c in r.find_elements(By.CSS_SELECTOR, "td[data-metric]")
        }
        for metric, value in _expected(it, step).items():
            shown = cells[metric].get_attribute("data-value")
            assert float(shown) == pytest.approx(value, rel=1e-9), (it["step"], metric)
        mismatch = it["mismatch"]["max_abs"]
        assert cells["mismatch_max"].text == f"{mismatch:.2e}"
        assert cells["bridge_break_rate"].text == f"{BRIDGE_BREAK_RATES[step]:.1%}"
        phases = {
            p.get_attribute("data-phase"): float(p.get_attribute("data-value"))
            for p in posted_row.find_elements(By.CSS_SELECTOR, "[data-phase]")
        }
        assert phases == pytest.approx(it["seconds"])
        posted = posted_row.find_element(By.CSS_SELECTOR, "td.other").text
        assert f"loss {it['loss']}" in posted
        assert f"grad_norm {it['grad_norm']}" in posted
        assert it["batch_id"] in row.text
    # Every chart is drawn, with a point or bar per version where there is a value.
    charts = {
        f.get_attribute("id"): f for f in browser.find_elements(By.CSS_SELECTOR, "figure.trend")
    }
    assert set(charts) == {
        "chart-reward",
        "chart-groups",
        "chart-staleness",
        "chart-bridge",
        "chart-mismatch",
        "chart-seconds",
    }
    versions = len(report["iterations"])
    for chart, series in [("reward", "mean reward"), ("mismatch", "max"), ("staleness", "max")]:
        points = charts[f"chart-{chart}"].find_elements(
            By.CSS_SELECTOR, f'circle[data-series="{series}"]'
        )
        assert len(points) == versions, chart
        assert all(p.is_displayed() for p in points)
    drawn = charts["chart-mismatch"].find_elements(By.CSS_SELECTOR, 'circle[data-series="max"]')
    heights = [float(p.get_attribute("cy")) for p in drawn]
    values = [it["mismatch"]["max_abs"] for it in report["iterations"]]
    # Higher on the (log) axis for a larger mismatch.
    assert sorted(range(versions), key=lambda i: heights[i]) == sorted(
        range(versions), key=lambda i: -values[i]
    )
    seconds = charts["chart-seconds"].find_elements(By.CSS_SELECTOR, "rect.part")
    assert len(seconds) == sum(len(it["seconds"]) for it in report["iterations"])
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    shoot(browser, screenshots, name)


def shoot(browser: Any, folder: Path, name: str) -> Path:
    height = browser.execute_script(
        "return document.documentElement.scrollHeight + window.outerHeight - window.innerHeight"
    )
    browser.set_window_size(1400, min(max(height, 600), 16_000))
    path = folder / f"{name}.png"
    assert browser.save_screenshot(str(path)), path
    browser.set_window_size(1400, 1000)
    print(f"screenshot: {path}")
    return path
