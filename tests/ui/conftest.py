"""The viewer's tests: real rollouts made through the real proxy, read through a read-only store."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from rolltap.store.packing import IdArray
from rolltap.ui.tokens import TokenTexts
from tests.support.audit_rollouts import Made, make_rollouts
from tests.support.fake_vllm import MODEL, decode
from tests.support.proxy import fake_engine
from tests.support.stores import opened_store


class FakeEngineTexts:
    """The fake engine's own detokenizer (its ids are bytes), as a viewer's token source."""

    def __init__(self) -> None:
        self.texts = TokenTexts(self)

    async def detokenize(self, sequences: Sequence[IdArray]) -> list[str]:
        return [decode([int(i) for i in ids]) for ids in sequences]

    async def for_model(self, model: str | None) -> TokenTexts | None:
        return self.texts

    async def preload(self) -> None:
        return None


@pytest.fixture(scope="module")
def fake_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Made]:
    """A SQLite store holding chat, Responses and Messages rollouts made through the proxy in
    front of the fake vLLM engine (the chat one with a drift break, finished with a reward)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('ui-store') / 'store.sqlite'}"

    async def make() -> Made:
        async with opened_store(url) as store:
            async with fake_engine() as engine:
                return await make_rollouts(store, engine.url, MODEL)

    return url, asyncio.run(make())


@pytest.fixture
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where browser tests leave their screenshots: ROLLTAP_UI_SCREENSHOTS, else a folder
    under pytest's base temporary directory (printed by the test that writes there)."""
    chosen = os.environ.get("ROLLTAP_UI_SCREENSHOTS")
    folder = Path(chosen) if chosen else tmp_path_factory.getbasetemp() / "ui-screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--window-size=1400,1000",
)


def browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.exists():
            return f"{path} is missing (Debian's chromium and chromium-driver: .ci/setup-browser)"
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    reason = browser_missing()
    if reason is not None:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
