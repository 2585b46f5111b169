"""The viewer's largest page: a 50-turn, 32k-token rollout, against a stated budget.

A synthetic agent rollout (tests/support/big_rollout.py: 50 turns of text and a bash tool call
growing to ~32k tokens, one drift break) is written into a fresh SQLite store through the real
writer, `rolltap ui` serves it in this process, and the script prints:

* the page weight: the rollout page's HTML, and its CSS and JS (what a first visit downloads);
* the server's render time of that page (wall time of a GET on loopback, several runs);
* the browser's load time in headless chromium (navigation start to the load event), when
  Debian's chromium, chromium-driver and selenium are installed;
* side by side, a 4-turn rollout's page, and what rendering every token strip inline would
  cost (the sum of all 50 strips), which is why strips load per call when they come into view.

Budget (the issue: "render in under a second"): server render <= 1.0 s and browser load <= 1.0 s
for the page, page weight <= 1 MB. A benchmark, not a test: it prints, it does not fail.

    python bench/ui_bench.py [--runs 5] [--turns 50] [--tokens 32768] [--no-browser]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rolltap.engine.errors import ModelLoadError
from rolltap.engine.model import default_gguf_path
from rolltap.store import Store
from rolltap.ui import UISettings, start_ui
from tests.support.big_rollout import write_big_rollout

BUDGET_SECONDS = 1.0
BUDGET_BYTES = 1_000_000
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


class _Loop:
    """An event loop on its own thread: the viewer keeps serving while selenium blocks."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()


@contextmanager
def serving(url: str, tokenizer: Path | None) -> Iterator[tuple[_Loop, str]]:
    loop = _Loop()
    store = loop.run(Store.connect(url, read_only=True))
    ui = loop.run(start_ui(UISettings(port=0, tokenizer=tokenizer), store))
    try:
        yield loop, ui.url
    finally:
        loop.run(ui.stop())
        loop.run(store.close())
        loop.stop()


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[float, bytes]:
    start = time.perf_counter()
    async with session.get(url) as resp:
        body = await resp.read()
        assert resp.status == 200, (url, resp.status, body[:300])
    return time.perf_counter() - start, body


async def _server(base: str, rollout_id: str, calls: int, runs: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        page = f"{base}/rollouts/{rollout_id}"
        # The first view also analyses the rollout (segments, drift); later views reuse that.
        first, _ = await _get(session, page)
        times, body = [], b""
        for _ in range(runs):
            took, body = await _get(session, page)
            times.append(took)
        assets = 0
        for name in ("ui.css", "ui.js"):
            assets += len((await _get(session, f"{base}/static/{name}"))[1])
        strips, strip_time = 0, 0.0
        for seq in range(1, calls + 1):
            took, fragment = await _get(session, f"{page}/calls/{seq}/tokens")
            strips += len(fragment)
            strip_time += took
    return {
        "first": first,
        "p50": statistics.median(times),
        "max": max(times),
        "html": len(body),
        "assets": assets,
        "strips_bytes": strips,
        "strips_time": strip_time,
    }


def _browser(base: str, rollout_id: str, runs: int) -> dict[str, float] | str:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        return "no /usr/bin/chromium or /usr/bin/chromedriver (.ci/setup-browser)"
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return "selenium is not installed"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tempfile.mkdtemp(prefix="ui-bench-chromium-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        loads, ready = [], []
        for _ in range(runs + 1):
            driver.get(f"{base}/rollouts/{rollout_id}")
            t = driver.execute_script(
                "const n = performance.getEntriesByType('navigation')[0];"
                "return [n.domContentLoadedEventEnd, n.loadEventEnd];"
            )
            ready.append(t[0] / 1000)
            loads.append(t[1] / 1000)
        # The first run fills the browser's cache of the CSS and JS, as a user's first visit.
        return {"load": statistics.median(loads[1:]), "ready": statistics.median(ready[1:])}
    finally:
        driver.quit()


def _tokenizer() -> tuple[Any, Path | None]:
    """SmolLM2's tokenizer when installed, for token ids that read as text."""
    try:
        path = default_gguf_path()
    except ModelLoadError:
        return None, None
    from transformers import AutoTokenizer

    from rolltap.engine import gguf_cache

    cached = gguf_cache.lookup(path)
    if cached is not None:
        return AutoTokenizer.from_pretrained(cached, local_files_only=True), path
    gguf = {"gguf_file": path.name, "local_files_only": True}
    return AutoTokenizer.from_pretrained(path.parent, **gguf), path


async def _write(url: str, turns: int, tokens: int, tokenizer: Any) -> tuple[str, str, int]:
    store = await Store.connect(url)
    try:
        big = await write_big_rollout(store, turns=turns, tokens=tokens, tokenizer=tokenizer)
        small = await write_big_rollout(
            store, turns=4, tokens=2_600, tokenizer=tokenizer, seed=1, batch="small"
        )
        return big.rollout_id, small.rollout_id, big.tokens
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=32_768)
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()

    tokenizer, path = _tokenizer()
    with tempfile.TemporaryDirectory(prefix="ui-bench-") as tmp:
        url = f"sqlite:///{tmp}/store.sqlite"
        big, small, tokens = asyncio.run(_write(url, args.turns, args.tokens, tokenizer))
        print(
            f"rollout: {args.turns} turns, {tokens:,} tokens"
            f" ({'SmolLM2 token ids' if tokenizer else 'random ids, no tokenizer'})"
        )
        with serving(url, path) as (loop, base):
            # The small rollout first: its first view also loads the tokenizer.
            little = loop.run(_server(base, small, 4, args.runs))
            large = loop.run(_server(base, big, args.turns, args.runs))
            browser: dict[str, float] | str = "skipped (--no-browser)"
            small_browser: dict[str, float] | str = browser
            if not args.no_browser:
                browser = _browser(base, big, args.runs)
                small_browser = _browser(base, small, args.runs)

    weight = large["html"] + large["assets"]
    print(
        f"budget: server render <= {BUDGET_SECONDS:.1f} s, browser load <= {BUDGET_SECONDS:.1f} s,"
        f" page weight <= {BUDGET_BYTES / 1e6:.1f} MB"
    )
    print(
        f"page weight: {weight:,} bytes ({large['html']:,} HTML + {large['assets']:,} CSS/JS)"
        f"  {'within' if weight <= BUDGET_BYTES else 'OVER'} budget"
    )
    verdict = "within" if max(large["first"], large["p50"]) <= BUDGET_SECONDS else "OVER"
    print(
        f"server render: first view {large['first'] * 1000:.0f} ms (with the analysis), then"
        f" p50 {large['p50'] * 1000:.0f} ms, max {large['max'] * 1000:.0f} ms over {args.runs}"
        f" runs  {verdict} budget"
    )
    print(
        f"  beside a 4-turn page: p50 {little['p50'] * 1000:.0f} ms, {little['html']:,} bytes"
        f" (the 50-turn page takes {large['p50'] / little['p50']:.1f}x the time)"
    )
    if isinstance(browser, dict) and isinstance(small_browser, dict):
        verdict = "within" if browser["load"] <= BUDGET_SECONDS else "OVER"
        print(
            f"browser load: p50 {browser['load'] * 1000:.0f} ms to the load event,"
            f" {browser['ready'] * 1000:.0f} ms to DOMContentLoaded  {verdict} budget"
            f"  (4-turn page: {small_browser['load'] * 1000:.0f} ms)"
        )
    else:
        print(f"browser load: {browser}")
    print(
        f"every call's token strip at once (what lazy strips avoid): {large['strips_bytes']:,} B,"
        f" {large['strips_time'] * 1000:.0f} ms of server time for {args.turns} requests"
    )


if __name__ == "__main__":
    main()
