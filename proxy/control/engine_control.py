"""Weight-update control calls to the engines behind the proxy: each engine's own RL control
plane, per backend kind.

    step          vLLM 0.33 (vllm/entrypoints/rl/online)  SGLang 0.5 (srt/entrypoints/http_server)
    pause         POST /pause?mode=wait|abort|keep         POST /pause_generation {mode}
    push          /start_weight_update, /update_weights    /update_weights_from_distributed
                  {update_info}, /finish_weight_update     {...update_info, weight_version}
                  {weight_version}
    set version   POST /update_weight_version              POST /update_weight_version
    read version  GET /weight_info                         GET /model_info
    checksums     POST /weight_checker {action: checksum}  POST /weights_checker
    resume        POST /resume                             POST /continue_generation

The update modes map onto the pause modes: drain = vLLM's `wait` (SGLang has none: the proxy
drains, and SGLang is paused `in_place` once nothing runs); abort_resume = `abort` on vLLM,
whose aborted answers the proxy continues token-in; SGLang's are drained instead, as before
(the proxy does not continue them); in_place = vLLM's `keep` / SGLang's `in_place`: running
requests freeze in the engine and go on after the resume, on the new weights, with no
re-prefill. A plain OpenAI-compatible server has no control plane: its weights are the
operator's business.

Loading a checkpoint (`model_path`): `POST /update_weights_from_disk` with SGLang's body, which
SGLang and rolltap's engine serve (vLLM 0.33 has no such route: its trainer pushes with
`update_info` over its transfer engine, or itself over NCCL).

Emptying prefix caches at a commit (whoever loaded the weights): SGLang takes no salt, so it is
flushed (`POST /flush_cache`) unless requests are frozen in it (in_place: SGLang refuses the
flush then, and the frozen answers keep their K/V by design); a vLLM-dialect engine is reset
(`POST /reset_prefix_cache`) only when its calls are not salted with their version
(proxy/upstream/sampling.py). A 200 answer `{"success": false}` counts as a failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from ..hold import UpdateMode
from ..upstream.backends import Backend
from ..upstream.engines import EngineKind


@dataclass(frozen=True)
class ControlResult:
    backend: str
    ok: bool
    detail: str
    value: Any = field(default=None, compare=False)
    """What the engine answered, where the step reads something (a version, checksums)."""

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "ok": self.ok, "detail": self.detail}


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    body: dict[str, Any] | None = None


_VLLM_PAUSE = {
    UpdateMode.DRAIN: "wait",
    UpdateMode.ABORT_RESUME: "abort",
    UpdateMode.IN_PLACE: "keep",
}


def pause_route(kind: EngineKind, mode: UpdateMode) -> Route | None:
    """How `begin` pauses an engine of `kind` for `mode`; None: it is not paused (a plain
    OpenAI server; SGLang in drain or abort_resume until the proxy drained it)."""
    if kind is EngineKind.VLLM:
        return Route("POST", f"/pause?mode={_VLLM_PAUSE[mode]}")
    if kind is EngineKind.SGLANG and mode is UpdateMode.IN_PLACE:
        return Route("POST", "/pause_generation", {"mode": "in_place"})
    return None


def drained_pause_route(kind: EngineKind) -> Route | None:
    """The pause an engine gets once the proxy drained its calls (SGLang has no `wait` mode):
    nothing runs, so in_place only stops its loop while the weights change."""
    if kind is EngineKind.SGLANG:
        return Route("POST", "/pause_generation", {"mode": "in_place"})
    return None


def resume_route(kind: EngineKind) -> Route | None:
    if kind is EngineKind.VLLM:
        return Route("POST", "/resume", {})
    if kind is EngineKind.SGLANG:
        return Route("POST", "/continue_generation", {})
    return None


def version_routes(
    kind: EngineKind, version: str, update_info: dict[str, Any] | list[Any] | None
) -> list[Route]:
    """How `commit` gives an engine the new weights' version: with the trainer's `update_info`,
    the whole push through the engine's transfer engine ending in the version; without it (the
    trainer pushed over NCCL itself), the version is set."""
    if kind is EngineKind.VLLM:
        if update_info is not None:
            return [
                Route("POST", "/start_weight_update", {}),
                Route("POST", "/update_weights", {"update_info": update_info}),
                Route("POST", "/finish_weight_update", {"weight_version": version}),
            ]
        return [Route("POST", "/update_weight_version", {"new_version": version})]
    if kind is EngineKind.SGLANG:
        if isinstance(update_info, dict):
            body = {**update_info, "weight_version": version}
            return [Route("POST", "/update_weights_from_distributed", body)]
        body = {"new_version": version, "abort_all_requests": False}
        return [Route("POST", "/update_weight_version", body)]
    return []


_READ_VERSION: dict[EngineKind, str] = {
    EngineKind.VLLM: "/weight_info",
    EngineKind.SGLANG: "/model_info",
}
_CHECKSUMS: dict[EngineKind, tuple[str, str]] = {
    EngineKind.VLLM: ("/weight_checker", "checksums"),
    EngineKind.SGLANG: ("/weights_checker", "per_engine_checksum"),
}
_FLUSH: dict[EngineKind, str] = {
    EngineKind.SGLANG: "/flush_cache",
    EngineKind.VLLM: "/reset_prefix_cache",
}


def controlled(backends: list[Backend]) -> list[Backend]:
    """The backends that have a control plane."""
    return [b for b in backends if b.kind is not EngineKind.OPENAI]


async def each(
    backends: list[Backend], step: Callable[[Backend], Awaitable[ControlResult | None]]
) -> list[ControlResult]:
    """`step` on every backend at once; the results of those it applied to."""
    results = await asyncio.gather(*(step(b) for b in backends))
    return [r for r in results if r is not None]


async def send(
    session: aiohttp.ClientSession, backend: Backend, route: Route | None, timeout: float = 60.0
) -> ControlResult | None:
    if route is None:
        return None
    return await _call(session, backend, route, timeout)


async def send_all(
    session: aiohttp.ClientSession, backend: Backend, routes: list[Route], timeout: float = 1800.0
) -> ControlResult | None:
    """Routes in order on one engine; the first failure ends it."""
    result: ControlResult | None = None
    for route in routes:
        result = await _call(session, backend, route, timeout)
        if not result.ok:
            return result
    return result


async def read_version(
    session: aiohttp.ClientSession, backend: Backend, expected: str
) -> ControlResult | None:
    """The engine's own weight version, read back: ok when it is `expected`."""
    path = _READ_VERSION.get(backend.kind)
    if path is None:
        return None
    result = await _call(session, backend, Route("GET", path), 30.0)
    if not result.ok:
        return result
    doc = result.value if isinstance(result.value, dict) else {}
    reported = doc.get("weight_version")
    if reported is None or str(reported) != expected:
        why = f"GET {path}: the engine reports weight version {reported!r}, not {expected!r}"
        return ControlResult(backend.url, False, why, reported)
    return ControlResult(backend.url, True, f"GET {path}: weight version {expected!r}", reported)


async def read_checksums(session: aiohttp.ClientSession, backend: Backend) -> ControlResult | None:
    """The engine's per-parameter checksums of the weights it serves; a failed result where it
    offers none (an older engine: 404)."""
    found = _CHECKSUMS.get(backend.kind)
    if found is None:
        return None
    path, key = found
    result = await _call(session, backend, Route("POST", path, {"action": "checksum"}), 600.0)
    if not result.ok:
        return result
    doc = result.value if isinstance(result.value, dict) else {}
    sums = doc.get(key)
    if not isinstance(sums, dict):
        return ControlResult(backend.url, False, f"POST {path}: no {key} in the answer")
    return ControlResult(backend.url, True, f"POST {path}: {len(sums)} checksums", sums)


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
        route = Route("POST", "/update_weights_from_disk", body)
        return await _call(session, backend, route, timeout)

    return list(await asyncio.gather(*(one(b) for b in backends)))


async def flush_prefix_caches(
    session: aiohttp.ClientSession,
    backends: list[Backend],
    *,
    salted: bool,
    frozen: bool = False,
    timeout: float = 60.0,
) -> list[ControlResult]:
    """Empty the prefix cache of every backend whose cache could serve K/V of the old weights
    (`salted`: vLLM-dialect calls carry a per-version salt, so theirs cannot; `frozen`: an
    in_place update, whose frozen requests SGLang will not flush under); one result per
    backend asked."""

    def asked(b: Backend) -> bool:
        if b.kind is EngineKind.VLLM:
            return not salted
        return b.kind is EngineKind.SGLANG and not frozen

    chosen = [b for b in backends if asked(b)]
    return list(
        await asyncio.gather(
            *(_call(session, b, Route("POST", _FLUSH[b.kind], {}), timeout) for b in chosen)
        )
    )


async def _call(
    session: aiohttp.ClientSession, backend: Backend, route: Route, timeout: float
) -> ControlResult:
    name = f"{route.method} {route.path}"
    try:
        async with session.request(
            route.method,
            backend.endpoint(route.path),
            data=None if route.body is None else orjson.dumps(route.body),
            headers={"Content-Type": "application/json"} if route.body is not None else None,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            raw = await resp.read()
            status = resp.status
    except (aiohttp.ClientError, TimeoutError) as e:
        return ControlResult(backend.url, False, f"{name}: {type(e).__name__}: {e}")
    doc = _json(raw)
    detail = _message(raw, doc) or f"HTTP {status}"
    if status != 200:
        return ControlResult(backend.url, False, f"{name}: HTTP {status}: {detail}", doc)
    if isinstance(doc, dict) and doc.get("success") is False:
        return ControlResult(backend.url, False, f"{name}: refused: {detail or 'success false'}")
    return ControlResult(backend.url, True, f"{name}: {detail}", doc)


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _message(raw: bytes, doc: Any) -> str:
    if not isinstance(doc, dict):
        return raw[:300].decode(errors="replace")
    for key in ("message", "error", "detail", "status"):
        value = doc.get(key)
        if isinstance(value, str):
            return value[:500]
        if isinstance(value, dict) and isinstance(value.get("message"), str):
            return str(value["message"])[:500]
    return ""
