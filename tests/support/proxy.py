"""Running the real proxy on loopback for tests, in front of real (fake-engine) servers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import openai
from aiohttp import web
from aiohttp.test_utils import TestServer

from rolltap.proxy.answers import LIVE, AnswerSource
from rolltap.proxy.context import ProxySettings
from rolltap.proxy.server import RunningProxy, start_proxy
from rolltap.store import NewRollout, Store
from tests.support.fake_vllm import FakeVLLM


@dataclass
class Engine:
    fake: FakeVLLM
    server: TestServer
    url: str = ""


ENGINE_EXTRAS = frozenset(
    {
        "logprobs",
        "top_logprobs",
        "stream_options",
        "return_token_ids",
        "return_weight_versions",
        "cache_salt",
    }
)
"""The keys rolltap adds to a vLLM-kind engine's chat request besides the client's own."""


@contextlib.asynccontextmanager
async def fake_engine(fake: FakeVLLM | None = None) -> AsyncIterator[Engine]:
    fake = fake or FakeVLLM()
    server = TestServer(fake.app())
    await server.start_server()
    try:
        yield Engine(fake, server, str(server.make_url("")).rstrip("/"))
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def running_proxy(
    store: Store, *backends: str, answers: AnswerSource = LIVE, **settings: object
) -> AsyncIterator[RunningProxy]:
    config = ProxySettings(backends=list(backends), port=0, health_interval=0.2, **settings)  # type: ignore[arg-type]
    proxy = await start_proxy(config, store, answers=answers)
    try:
        yield proxy
    finally:
        await proxy.stop()


async def new_rollout(store: Store, **fields: object) -> tuple[str, str]:
    created = await store.create_rollout(NewRollout(**fields))  # type: ignore[arg-type]
    return created.id, created.key


def app_of(proxy: RunningProxy) -> web.Application:
    return proxy._runners[0].app


class OpenAIFactory:
    """Async openai clients that are closed when the test ends (their pools need the loop)."""

    def __init__(self) -> None:
        self._clients: list[openai.AsyncOpenAI] = []

    def __call__(
        self, base_url: str, api_key: str = "unused", **kwargs: object
    ) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, **kwargs)  # type: ignore[arg-type]
        self._clients.append(client)
        return client

    async def close(self) -> None:
        for client in self._clients:
            await client.close()
