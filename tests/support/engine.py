"""A session-wide SmolLM2 engine child process for every suite that needs a real model backend.

Use it from a conftest with `from tests.support.engine import smollm_engine  # noqa: F401`;
tests then take `smollm_engine` and talk HTTP to `smollm_engine.url` (no /v1 suffix) with
`model=smollm_engine.model`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from rolltap.engine.errors import ModelLoadError
from rolltap.engine.launch import EngineProcess
from rolltap.engine.model import default_gguf_path

_ENGINE = pytest.StashKey[EngineProcess]()


@pytest.fixture(scope="session")
def smollm_engine(request: pytest.FixtureRequest) -> EngineProcess:
    """The default SmolLM2-135M-Instruct engine (CPU, float32, processed logprobs), loaded once.

    One process per test session even when several conftests import this fixture (each import
    is a separate fixture definition to pytest): the engine lives in the session's stash.
    """
    engine = request.config.stash.get(_ENGINE, None)
    if engine is None:
        try:
            default_gguf_path()
        except ModelLoadError as e:
            pytest.fail(str(e))
        engine = EngineProcess.start(extra_args=("--max-batch", "16"))
        request.config.stash[_ENGINE] = engine
        request.config.add_cleanup(engine.stop)
    return engine


async def post_json(
    url: str, path: str, body: object, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """POST a JSON body; return the status and the decoded JSON answer."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + path, json=body, headers=headers) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


async def get_json(url: str, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url + path) as resp:
        text = await resp.text()
        return resp.status, json.loads(text) if text else None


async def post_sse(url: str, path: str, body: object) -> list[dict[str, Any]]:
    """POST a streaming request; return its `data:` frames, checking the stream ends in [DONE]."""
    frames: list[str] = []
    async with aiohttp.ClientSession() as session, session.post(url + path, json=body) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        buffer = ""
        async for chunk in resp.content.iter_any():
            buffer += chunk.decode()
        for event in buffer.split("\n\n"):
            if event:
                assert event.startswith("data: "), event
                frames.append(event[len("data: ") :])
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


async def engine_stats(url: str) -> dict[str, Any]:
    status, body = await get_json(url, "/stats")
    assert status == 200
    return body  # type: ignore[no-any-return]


async def wait_until_idle(url: str) -> dict[str, Any]:
    """Poll /stats until nothing runs or waits (a cancellation has landed); return the stats."""
    for _ in range(600):
        current = await engine_stats(url)
        if current["running"] == 0 and current["waiting"] == 0:
            return current
        await asyncio.sleep(0.1)
    raise AssertionError(f"the engine is still busy: {current}")
