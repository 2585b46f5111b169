"""The list pages in the real browser at 1400 px: the Rollouts table fits its container (no
column is cut, whatever the batch, task and harness names), and a rollout made by hand, in no
batch, is on the index page."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rolltap.store import NewRollout, RolloutStatus
from rolltap.store.events import Declared
from tests.support.audit_rollouts import Made
from tests.support.processes import free_port
from tests.support.stores import opened_store
from tests.ui.conftest import browser_missing

LONG_BATCH = "swe-bench-verified-subset-of-fifty-mini-swe-agent-0a1b2c3d"
LONG_TASK = "astropy__astropy-14365-fix-the-qdp-reader-case"


@pytest.fixture(scope="module")
def viewer(fake_store: tuple[str, Made]) -> Iterator[tuple[str, str]]:
    """`rolltap ui` on the fake engine's rollouts, with long-named ones and one made by hand;
    (its URL, the hand-made rollout's id)."""
    reason = browser_missing()
    if reason is not None:
        pytest.skip(reason)
    url, _ = fake_store

    async def add() -> str:
        async with opened_store(url) as store:
            for sample in range(2):
                made = await store.create_rollout(
                    NewRollout(
                        batch_id=LONG_BATCH,
                        task_id=LONG_TASK,
                        sample_index=sample,
                        harness="mini-swe-agent",
                    )
                )
                await store.report(made.id, Declared(RolloutStatus.BUDGET_EXCEEDED))
            # As `curl -X POST /admin/rollouts -d '{"task_id": "t1"}'` makes it: no batch.
            return (await store.create_rollout(NewRollout(task_id="t1"))).id

    by_hand = asyncio.run(add())
    port = free_port()
    command = [sys.executable, "-m", "rolltap.cli.main", "ui", "--db", url, "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(base + "/", timeout=5):
                    break
            except OSError:
                assert process.poll() is None, "rolltap ui exited"
                assert time.monotonic() < deadline, "rolltap ui did not start"
                time.sleep(0.1)
        yield base, by_hand
    finally:
        process.terminate()
        process.wait(timeout=30)


# Each header and cell's right edge against the right edge of what holds the table (and the
# page's own width): a column past it is cut off or needs a sideways scroll.
_CUT = """
const table = document.querySelector(arguments[0]);
const holder = table.parentElement;
const box = holder.getBoundingClientRect();
const edge = Math.min(box.right - parseFloat(getComputedStyle(holder).paddingRight),
                      document.documentElement.clientWidth);
return [...table.querySelectorAll('th, td')]
  .filter(c => c.getBoundingClientRect().right > edge + 0.5 || c.scrollWidth > c.clientWidth + 1)
  .map(c => c.textContent.trim().slice(0, 40) + ' @' + Math.round(c.getBoundingClientRect().right)
       + ' > ' + Math.round(edge));
"""


def test_the_rollouts_table_fits_1400_px(
    browser: Any, viewer: tuple[str, str], screenshots: Path
) -> None:
    base, _ = viewer
    browser.set_window_size(1400, 1000)
    browser.get(base + "/rollouts")
    assert browser.execute_script("return window.innerWidth") <= 1400
    header = [th.text for th in browser.find_elements("css selector", "table.grid th")]
    assert header[-1] == "harness"
    assert browser.execute_script(_CUT, "table.grid") == []
    page = browser.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert page[0] <= page[1], "the page scrolls sideways"
    # Long names wrap or shorten, but the whole name is still there (and on hover).
    row = browser.find_element("xpath", f"//tr[td[contains(., '{LONG_TASK[:20]}')]]")
    titles = [e.get_attribute("title") for e in row.find_elements("css selector", "[title]")]
    assert LONG_BATCH in titles
    assert LONG_TASK in titles
    assert "mini-swe-agent" in row.text
    path = screenshots / "rollouts-1400.png"
    assert browser.save_screenshot(str(path))
    print(f"screenshot: {path}")


def test_a_rollout_made_by_hand_is_on_the_index_page(
    browser: Any, viewer: tuple[str, str], screenshots: Path
) -> None:
    base, by_hand = viewer
    browser.get(base + "/")
    text = browser.find_element("tag name", "main").text
    assert "ui-batch" in text  # the batches are still listed
    links = [a.get_attribute("href") for a in browser.find_elements("css selector", "main a[href]")]
    assert f"{base}/rollouts/{by_hand}" in links
    assert browser.execute_script(_CUT, "table.grid") == []
    path = screenshots / "index-1400.png"
    assert browser.save_screenshot(str(path))
    print(f"screenshot: {path}")
