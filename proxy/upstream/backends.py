"""The inference backends the proxy forwards to: their kind, health and current load."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import aiohttp

from .engines import EngineKind

log = logging.getLogger(__name__)


@dataclass
class Backend:
    url: str
    """Base URL without a trailing slash or /v1, e.g. http://127.0.0.1:8200."""
    kind: EngineKind
    healthy: bool = True
    inflight: int = 0
    served: int = 0
    failures: int = 0
    """Consecutive failed health checks or connection failures."""
    context: int | None = None
    """vLLM's `max_model_len`, from its /v1/models card (forward.py spells out a completions
    request's limit with it)."""

    def endpoint(self, path: str) -> str:
        return self.url + path


def parse_backend(spec: str) -> tuple[str, EngineKind]:
    """`URL` (vLLM dialect) or `KIND=URL` with KIND one of vllm, sglang, openai."""
    kind = EngineKind.VLLM
    if "=" in spec.split("://", 1)[0]:
        name, spec = spec.split("=", 1)
        try:
            kind = EngineKind(name.strip().lower())
        except ValueError:
            kinds = ", ".join(k.value for k in EngineKind)
            raise ValueError(f"unknown backend kind {name!r}; use one of {kinds}") from None
    url = spec.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"backend {spec!r} is not an http(s) URL")
    return url, kind


class BackendPool:
    """Backends by URL. A change bumps `version`, so routers know to rebuild their rings."""

    def __init__(self, failure_threshold: int = 2) -> None:
        self._backends: dict[str, Backend] = {}
        self._failure_threshold = failure_threshold
        self.version = 0

    def add(self, url: str, kind: EngineKind) -> Backend:
        existing = self._backends.get(url)
        if existing is not None:
            existing.kind = kind
            return existing
        backend = self._backends[url] = Backend(url, kind)
        self.version += 1
        return backend

    def remove(self, url: str) -> Backend | None:
        removed = self._backends.pop(url, None)
        if removed is not None:
            self.version += 1
        return removed

    def get(self, url: str) -> Backend | None:
        return self._backends.get(url)

    def all(self) -> list[Backend]:
        return list(self._backends.values())

    def healthy(self) -> list[Backend]:
        return [b for b in self._backends.values() if b.healthy]

    def mark_failed(self, backend: Backend) -> None:
        """A connection failure takes a backend out at once; health checks bring it back."""
        backend.failures += 1
        if backend.healthy:
            backend.healthy = False
            self.version += 1

    def _mark_check(self, backend: Backend, ok: bool, *, refused: bool = False) -> None:
        """A refused connection takes a backend out at once (nothing listens there); a slow
        or non-200 answer only after `failure_threshold` checks in a row."""
        if ok:
            backend.failures = 0
            if not backend.healthy:
                backend.healthy = True
                self.version += 1
            return
        backend.failures += 1
        if backend.healthy and (refused or backend.failures >= self._failure_threshold):
            backend.healthy = False
            self.version += 1

    async def check_all(self, session: aiohttp.ClientSession, timeout: float) -> None:
        async def check(backend: Backend) -> None:
            refused = False
            try:
                async with session.get(
                    backend.endpoint("/health"), timeout=aiohttp.ClientTimeout(total=timeout)
                ) as resp:
                    ok = resp.status == 200
            except aiohttp.ClientConnectorError:
                ok, refused = False, True
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            self._mark_check(backend, ok, refused=refused)

        await asyncio.gather(*(check(b) for b in self.all()))

    async def served_models(self, session: aiohttp.ClientSession) -> set[str]:
        """What the healthy backends list on /v1/models (one that cannot say is left out)."""
        served: set[str] = set()
        for backend in self.healthy():
            try:
                async with session.get(
                    backend.endpoint("/v1/models"), timeout=aiohttp.ClientTimeout(total=10)
                ) as resp:
                    listed = await resp.json() if resp.status == 200 else {}
            except (aiohttp.ClientError, TimeoutError, ValueError):
                continue
            data = listed.get("data") if isinstance(listed, dict) else None
            for card in data if isinstance(data, list) else []:
                if isinstance(card, dict) and isinstance(card.get("id"), str):
                    served.add(card["id"])
                if isinstance(card, dict) and card.get("owned_by") == "vllm":
                    length = card.get("max_model_len")
                    backend.context = length if isinstance(length, int) else None
        return served

    async def run_health_checks(
        self, session: aiohttp.ClientSession, interval: float, timeout: float = 2.0
    ) -> None:
        """Check every backend every `interval` seconds (the app checks once before serving)."""
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(Exception):
                await self.check_all(session, timeout)
