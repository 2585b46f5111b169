"""Weight-update control calls to the engines behind the proxy, per backend kind.

Aborting (abort_resume) asks only engines whose aborted answers the proxy can continue
token-in: vLLM's dialect (vLLM in dev mode, rolltap's built-in engine), `POST /abort_requests
{}`. Calls on other backends are drained instead. Loading weights: `POST
/update_weights_from_disk` with SGLang's body, which SGLang and rolltap's engine serve. A plain
OpenAI-compatible server has neither: its weights are the operator's business.

Emptying prefix caches at a commit (whoever loaded the weights): SGLang takes no salt, so it
is always flushed (`POST /flush_cache`); a vLLM-dialect engine is reset (`POST
/reset_prefix_cache`, vLLM's dev-mode route, which rolltap's engine serves too) only when its
calls are not salted with their version (proxy/upstream/sampling.py). vLLM may answer that route
200 with
`{"success": false}` when it refuses; that counts as a failure.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from ..upstream.backends import Backend
from ..upstream.engines import EngineKind

_ABORT: dict[EngineKind, tuple[str, dict[str, Any]]] = {EngineKind.VLLM: ("/abort_requests", {})}


@dataclass(frozen=True)
class ControlResult:
    backend: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "ok": self.ok, "detail": self.detail}


async def abort_all(
    session: aiohttp.ClientSession, backends: list[Backend], timeout: float = 10.0
) -> list[ControlResult]:
    """Ask every backend that can to end its running requests with finish_reason "abort"."""

    async def one(backend: Backend) -> ControlResult:
        route = _ABORT.get(backend.kind)
        if route is None:
            why = f"{backend.kind.value} answers are not resumed token-in: its calls are drained"
            return ControlResult(backend.url, False, why)
        return await _post(session, backend, route[0], route[1], timeout)

    return list(await asyncio.gather(*(one(b) for b in backends)))


async def load_weights(
    session: aiohttp.ClientSession,
    backends: list[Backend],
    body: dict[str, Any],
    timeout: float = 1800.0,
) -> list[ControlResult]:
    """`update_weights_from_disk` on every backend at once; one result per backend."""

    async def one(backend: Backend) -> ControlResult:
        if backend.kind is EngineKind.OPENAI:
            return ControlResult(backend.url, False, "an openai backend cannot load weights")
        return await _post(session, backend, "/update_weights_from_disk", body, timeout)

    return list(await asyncio.gather(*(one(b) for b in backends)))


_FLUSH: dict[EngineKind, str] = {
    EngineKind.SGLANG: "/flush_cache",
    EngineKind.VLLM: "/reset_prefix_cache",
}


async def flush_prefix_caches(
    session: aiohttp.ClientSession, backends: list[Backend], *, salted: bool, timeout: float = 60.0
) -> list[ControlResult]:
    """Empty the prefix cache of every backend whose cache could serve K/V of the old weights
    (`salted`: vLLM-dialect calls carry a per-version salt, so theirs cannot); one result per
    backend asked."""
    asked = [b for b in backends if b.kind in _FLUSH and not (salted and b.kind is EngineKind.VLLM)]
    return list(
        await asyncio.gather(*(_post(session, b, _FLUSH[b.kind], {}, timeout) for b in asked))
    )


async def _post(
    session: aiohttp.ClientSession,
    backend: Backend,
    path: str,
    body: dict[str, Any],
    timeout: float,
) -> ControlResult:
    try:
        async with session.post(
            backend.endpoint(path),
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            raw = await resp.read()
            status = resp.status
    except (aiohttp.ClientError, TimeoutError) as e:
        return ControlResult(backend.url, False, f"{path}: {type(e).__name__}: {e}")
    detail = _message(raw) or f"HTTP {status}"
    if status != 200:
        return ControlResult(backend.url, False, f"{path}: HTTP {status}: {detail}")
    if _refused(raw):
        return ControlResult(backend.url, False, f"{path}: refused: {detail or 'success false'}")
    return ControlResult(backend.url, True, detail)


def _refused(raw: bytes) -> bool:
    """A 200 answer that says it did not do it (`{"success": false}`)."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return isinstance(doc, dict) and doc.get("success") is False


def _message(raw: bytes) -> str:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:300].decode(errors="replace")
    if not isinstance(doc, dict):
        return raw[:300].decode(errors="replace")
    if isinstance(doc.get("message"), str):
        return str(doc["message"])[:500]
    error = doc.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])[:500]
    return ""
