"""The training view on a real run: three steps of a trainer through the real rollout service
(groups kept and dropped, token-in bridges and breaks, weight updates, one batch sampled a
version behind, figures posted with `client.post_metrics`; tests/support/training_run.py).
Its numbers are checked against the run's report over HTTP and in the real browser, which
leaves a screenshot of the page (the `screenshots` fixture)."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from rolltap.store import NewRollout, RolloutStatus
from rolltap.store.events import Declared
from rolltap.store.ids import new_id
from rolltap.store.models import MetricsSource
from rolltap.store.training import PostedMetrics
from rolltap.ui import UIContext, UISettings, make_app
from rolltap.ui.training import RunSelection, read_run
from tests.support.stores import opened_store
from tests.support.training_run import make_training_run, posted_metrics
from tests.support.training_view import (
    browser_errors,
    chart_points,
    open_session,
    running_ui,
    shoot,
    shown_versions,
)
from tests.ui.conftest import FakeEngineTexts

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
        async with opened_store(url) as store:
            return await make_training_run(store, folder / "logs")

    return url, asyncio.run(make())


@pytest.fixture
async def viewer(
    training_run: tuple[str, dict[str, Any]], aiohttp_client: ClientMaker
) -> AsyncIterator[Client]:
    url, _ = training_run
    async with opened_store(url, read_only=True) as store:
        yield await aiohttp_client(make_app(UIContext(store, UISettings(), FakeEngineTexts())))


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


def test_the_training_view_in_the_browser(
    browser: Any, training_run: tuple[str, dict[str, Any]], screenshots: Path
) -> None:
    """Open the run from the batches page as a person would and compare every row's numbers
    with the report's iteration for that policy version."""
    from selenium.webdriver.common.by import By

    url, report = training_run
    with running_ui(url) as base:
        open_session(browser, base, report["session"])
        shown = shown_versions(browser)
        assert [v.version for v in shown] == [it["policy_version"] for it in report["iterations"]]
        for step, (row, it) in enumerate(zip(shown, report["iterations"], strict=True)):
            for metric, value in _expected(it, step).items():
                assert row.number(metric) == pytest.approx(value, rel=1e-9), (step, metric)
            assert row.texts["mismatch_max"] == f"{it['mismatch']['max_abs']:.2e}"
            assert row.texts["bridge_break_rate"] == f"{BRIDGE_BREAK_RATES[step]:.1%}"
            assert row.phases == pytest.approx(it["seconds"])
            assert row.posted["loss"] == it["loss"]
            assert row.posted["grad_norm"] == it["grad_norm"]
            assert f"loss {it['loss']:.4g}" in row.posted_text
            assert it["batch_id"] in row.batches
        # Every chart is drawn, with a point or bar per version where there is a value.
        charts = [f.get_attribute("id") for f in browser.find_elements(By.CSS_SELECTOR, "figure")]
        assert charts == [
            "chart-reward",
            "chart-groups",
            "chart-staleness",
            "chart-bridge",
            "chart-mismatch",
            "chart-seconds",
        ]
        versions = len(report["iterations"])
        for chart, series in [("reward", "mean reward"), ("mismatch", "max"), ("staleness", "max")]:
            points = chart_points(browser, chart, series)
            assert len(points) == versions, chart
            assert all(p.is_displayed() for p in points)
        heights = [float(p.get_attribute("cy")) for p in chart_points(browser, "mismatch", "max")]
        values = [it["mismatch"]["max_abs"] for it in report["iterations"]]
        # Higher on the (log) axis for a larger mismatch.
        assert sorted(range(versions), key=lambda i: heights[i]) == sorted(
            range(versions), key=lambda i: -values[i]
        )
        bars = browser.find_elements(By.CSS_SELECTOR, "#chart-seconds rect.part")
        assert len(bars) == sum(len(it["seconds"]) for it in report["iterations"])
        assert browser_errors(browser) == []
        shoot(browser, screenshots, "training")


async def test_without_posted_seconds_a_version_shows_the_services_sampling_time(
    tmp_path: Path,
) -> None:
    """A batch its trainer posted nothing about, and one `rolltap run` made (no service record,
    no policy version): the first shows the service's sampling time, the second its reward."""
    async with opened_store(f"sqlite:///{tmp_path / 'store.sqlite'}") as store:
        for batch_id, meta, reward in [("served", {"policy_version": "5"}, 1.0), ("ran", {}, 0.0)]:
            made = await store.create_rollout(
                NewRollout(batch_id=batch_id, task_id="t", sample_index=0, meta=meta)
            )
            await store.report(made.id, Declared(RolloutStatus.FINISHED), reward=reward)
        await store.record_metrics(
            PostedMetrics(
                id=new_id(),
                batch_id="served",
                source=MetricsSource.SERVICE,
                policy_version="5",
                session="S1",
                posted_at=datetime.now(UTC),
                metrics={
                    "status": "done",
                    "labels": {},
                    "samples_per_task": 1,
                    "groups": {"complete": 1, "kept": 1, "dropped": {}},
                    "seconds": {"sample": 12.5},
                },
            )
        )
        run = await read_run(store, RunSelection(batches=("served", "ran")), 1.0)
    served, ran = run.rows
    assert (served.version, served.seconds, served.seconds_source) == (
        "5",
        {"sample": 12.5},
        "service",
    )
    assert (served.kept, served.dropped, served.mean_reward) == (1, {}, 1.0)
    assert (ran.version, ran.seconds, ran.kept, ran.mean_reward) == ("-", {}, None, 0.0)
    assert run.sessions == ["S1"]


async def test_a_store_without_service_batches_says_how_to_make_one(
    tmp_path: Path, aiohttp_client: ClientMaker
) -> None:
    url = f"sqlite:///{tmp_path / 'empty.sqlite'}"
    async with opened_store(url):  # a new, empty store
        pass
    async with opened_store(url, read_only=True) as store:
        client = await aiohttp_client(make_app(UIContext(store, UISettings(), FakeEngineTexts())))
        page = await (await client.get("/training")).text()
    assert "No batch in this store was run by the rollout service yet" in page
