"""The viewer's tests: real rollouts made through the real proxy, read through a read-only store."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from rolltap.store import Store
from rolltap.store.packing import IdArray
from rolltap.ui.tokens import TokenTexts
from tests.support.audit_rollouts import Made, make_rollouts
from tests.support.fake_vllm import MODEL, decode
from tests.support.proxy import fake_engine


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
        store = await Store.connect(url)
        try:
            async with fake_engine() as engine:
                return await make_rollouts(store, engine.url, MODEL)
        finally:
            await store.close()

    return url, asyncio.run(make())


@pytest.fixture
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where browser tests leave their screenshots: ROLLTAP_UI_SCREENSHOTS, else a folder
    under pytest's base temporary directory (printed by the test that writes there)."""
    chosen = os.environ.get("ROLLTAP_UI_SCREENSHOTS")
    folder = Path(chosen) if chosen else tmp_path_factory.getbasetemp() / "ui-screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder
