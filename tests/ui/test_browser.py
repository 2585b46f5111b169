"""The viewer in a real headless browser (Debian's chromium, driven by selenium), on real
rollouts: harness-like clients talked to the real proxy in front of the real SmolLM2 engine in
all three dialects, one conversation broke the token chain, one ended with a reward and the
verifier's output; beside them a synthetic 50-turn, 32k-token rollout. `rolltap ui` runs as its
own process. Every test leaves full-page screenshots (see the `screenshots` fixture).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rolltap.engine.launch import EngineProcess
from rolltap.engine.model import default_gguf_path
from tests.support.audit_rollouts import HOSTILE, Made, make_rollouts
from tests.support.big_rollout import BigRollout, write_big_rollout
from tests.support.stores import opened_store
from tests.ui.conftest import browser_missing

pytestmark = [pytest.mark.model, pytest.mark.slow]

WAIT = 60.0


@dataclass(frozen=True)
class Viewer:
    url: str
    made: Made
    big: BigRollout


@pytest.fixture(scope="module")
def viewer(
    tmp_path_factory: pytest.TempPathFactory, smollm_engine: EngineProcess
) -> Iterator[Viewer]:
    """The real rollouts in a SQLite store, and `rolltap ui` serving it on a free port."""
    if browser_missing() is not None:
        pytest.skip(browser_missing())
    url = f"sqlite:///{tmp_path_factory.mktemp('ui-real') / 'store.sqlite'}"

    async def make() -> tuple[Made, BigRollout]:
        async with opened_store(url) as store:
            made = await make_rollouts(store, smollm_engine.url, smollm_engine.model)
            return made, await write_big_rollout(store)

    made, big = asyncio.run(make())
    command = [sys.executable, "-m", "rolltap.cli.main", "ui", "--db", url, "--port", "0"]
    command += ["--tokenizer", str(default_gguf_path())]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield Viewer(_announced(process), made, big)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _announced(process: subprocess.Popen[str]) -> str:
    """The URL from `rolltap ui on http://...`, read within WAIT seconds."""
    found: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            found.append(line)
            if line.startswith("rolltap ui on "):
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(WAIT)
    if not found or not found[-1].startswith("rolltap ui on "):
        raise AssertionError(f"rolltap ui did not start: {''.join(found)!r}")
    return found[-1].split()[3]


def _wait(browser: Any, condition: Callable[[], Any], what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, WAIT).until(lambda _: condition(), message=what)


def _shoot(browser: Any, folder: Path, name: str) -> Path:
    """A full-page screenshot (the window grown to the page, up to 16,000 px)."""
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1400, min(max(height, 600), 16_000))
    browser.execute_script("window.scrollTo(0, 0)")
    path = folder / f"{name}.png"
    assert browser.save_screenshot(str(path)), path
    browser.set_window_size(1400, 1000)
    print(f"screenshot: {path}")
    return path


def _css(browser: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(browser.find_elements(By.CSS_SELECTOR, selector))


def _load_strips(browser: Any) -> None:
    """Bring every token strip slot into view and wait until each has loaded."""
    for slot in _css(browser, ".strip-slot"):
        browser.execute_script("arguments[0].scrollIntoView()", slot)
        _wait(browser, lambda s=slot: s.get_attribute("data-state") == "loaded", "a strip loads")


def _errors(browser: Any) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_batch_pages(browser: Any, viewer: Viewer, screenshots: Path) -> None:
    browser.get(viewer.url + "/")
    (link,) = [a for a in _css(browser, "table.grid a") if a.text == "ui-batch"]
    link.click()
    _wait(browser, lambda: _css(browser, "figure.chart"), "the batch page")
    bars = _css(browser, "rect.bar")
    assert len(bars) == 2
    assert [b.get_attribute("height") != "0.0" for b in bars] == [True, True]
    dots = _css(browser, "circle.dot")
    assert len(dots) == 2  # pass@1 and pass@2
    assert "capital" in browser.find_element("css selector", "table.grid").text
    _shoot(browser, screenshots, "batch")
    assert _errors(browser) == []


def test_rollout_filters(browser: Any, viewer: Viewer, screenshots: Path) -> None:
    from selenium.webdriver.support.ui import Select

    browser.get(viewer.url + "/rollouts")
    assert len(_css(browser, "table.grid tbody tr")) == 4
    Select(browser.find_element("name", "drift")).select_by_value("history_edited")
    browser.find_element("css selector", "form.filters button").click()
    _wait(browser, lambda: "drift=history_edited" in browser.current_url, "the filtered list")
    rows = _css(browser, "table.grid tbody tr")
    assert {r.find_element("css selector", "code").text for r in rows} == {
        viewer.made.chat,
        viewer.big.rollout_id,
    }
    _shoot(browser, screenshots, "rollouts-drift")
    browser.get(viewer.url + "/rollouts?min_reward=0.5&harness=script")
    assert [r.find_element("css selector", "code").text for r in _css(browser, "tbody tr")] == [
        viewer.made.chat
    ]


def test_rollout_page(browser: Any, viewer: Viewer, screenshots: Path) -> None:
    browser.get(f"{viewer.url}/rollouts/{viewer.made.chat}")
    head = browser.find_element("css selector", ".big-reward").text
    assert head.split() == ["1", "REWARD"]
    outcome = browser.find_element("id", "outcome").text
    assert "PASSED tests/test_answer.py::test_capital" in outcome
    assert "step 2: write answer.txt" in outcome
    integrity = browser.find_element("id", "integrity").text
    assert "intact" in integrity
    assert "sealed at call 5" in integrity
    assert "request body is not valid JSON" in integrity  # the refused call, listed
    assert len(_css(browser, "table.timeline tbody tr")) == 5
    (article,) = _css(browser, "article.break")
    assert "history edited at call 3" in article.text
    assert _css(article, "del")  # the shortened answer, struck out in the diff

    _load_strips(browser)
    strips = _css(browser, ".strip")
    assert len(strips) == 4
    first = strips[0]
    sampled = _css(first, "i.s")
    context = _css(first, "i.c")
    assert sampled
    assert context
    shade = [e.value_of_css_property("background-color") for e in (context[0], sampled[0])]
    assert shade[0] != shade[1]  # the loss mask is visible
    (turn,) = _css(browser, "#call-1 .answer .text")
    assert "".join(e.text for e in sampled).startswith(turn.text.strip()[:20])
    # The break shows in the token strip of the call it broke, with the tokens it lost.
    (mark,) = _css(browser, ".strip b.mark")
    assert "history edited" in mark.text
    lost = _css(browser, ".strip i.x")
    assert lost
    assert "underline" in lost[0].value_of_css_property("text-decoration-line")
    assert "logprob" in sampled[0].get_attribute("title")
    # Hostile text from the conversation is shown, never run.
    assert HOSTILE in browser.find_element("id", "call-3").text
    assert browser.execute_script("return typeof window.pwned") == "undefined"
    assert _errors(browser) == []
    _shoot(browser, screenshots, "rollout-chat")


@pytest.mark.parametrize(
    ("which", "expected"),
    [
        ("responses", ["Answer in one word.", "Name a planet.", "Another."]),
        ("messages", ["Answer briefly.", "Name a colour.", "And another one?"]),
    ],
)
def test_every_dialect(
    browser: Any, viewer: Viewer, screenshots: Path, which: str, expected: list[str]
) -> None:
    browser.get(f"{viewer.url}/rollouts/{getattr(viewer.made, which)}")
    turns = browser.find_element("id", "turns").text
    for text in expected:
        assert text in turns
    _load_strips(browser)
    assert len(_css(browser, ".strip i.s")) > 0
    assert _errors(browser) == []
    _shoot(browser, screenshots, f"rollout-{which}")


def test_largest_rollout(browser: Any, viewer: Viewer, screenshots: Path) -> None:
    """50 turns, ~32k tokens: the page arrives complete and the token strips load lazily."""
    browser.get(f"{viewer.url}/rollouts/{viewer.big.rollout_id}")
    timing = browser.execute_script(
        "const t = performance.getEntriesByType('navigation')[0];"
        "return {load: t.loadEventEnd, bytes: t.transferSize};"
    )
    turns = _css(browser, "article.turn")
    assert len(turns) == viewer.big.calls == 50
    assert not _css(browser, ".strip-slot[data-state]")  # the turns are below the fold
    browser.execute_script("arguments[0].scrollIntoView()", turns[0])
    _wait(browser, lambda: _css(browser, ".strip-slot[data-state=loaded]"), "the first strips")
    loaded = len(_css(browser, ".strip-slot[data-state=loaded]"))
    assert 0 < loaded < 50  # only what is near the screen
    last = _css(browser, ".strip-slot")[-1]
    browser.execute_script("arguments[0].scrollIntoView()", last)
    _wait(browser, lambda: last.get_attribute("data-state") == "loaded", "the last strip")
    (earlier,) = _css(last, "a.earlier")
    before = len(_css(last, "i"))
    earlier.click()
    _wait(browser, lambda: len(_css(last, "i")) > before, "earlier tokens")
    assert _errors(browser) == []
    (screenshots / "largest-rollout.json").write_text(json.dumps(timing))
    _shoot(browser, screenshots, "rollout-largest")


def test_call_page(browser: Any, viewer: Viewer, screenshots: Path) -> None:
    browser.get(f"{viewer.url}/rollouts/{viewer.made.chat}/calls/2")
    text = browser.find_element("tag name", "main").text
    assert "What is the capital of France?" in text  # every message the call sent
    assert _css(browser, ".strip i.s")  # the strip is part of the page itself
    assert _css(browser, ".strip i.c")
    assert _errors(browser) == []
    _shoot(browser, screenshots, "call")
