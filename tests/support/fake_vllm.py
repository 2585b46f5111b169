"""A fake inference engine: a real aiohttp server speaking vLLM 0.33's chat wire format.

Token ids are bytes of the text shifted by 3 (0 = BOS, 1 = <|im_start|>, 2 = <|im_end|>), under a
ChatML-like template, so prompts of a growing conversation extend each other exactly as a real
engine's do. Streams carry one token per chunk, with the deltas a vLLM parser would emit for it:
reasoning and content as their characters complete, a tool call as a head fragment (id, name) then
its arguments a character at a time. `/tokenize` renders messages and tools the same way.
Logprobs are a fixed function of the token id. What it answers is decided by a `script` (request
body -> Reply). Faults are typed values (`Fault`, one dataclass per kind) set per reply; across a
process boundary they travel as their `spec` text (the `x-fake-fault` header, or "fault=<spec>" in
a standalone engine's last message) and `parse_fault` reads it back: Refuse (close before
answering), Status(code, message), DieAfter(k) (stream k chunks and drop the connection), Hang,
NoIds (behave like a plain OpenAI server), and malformed answers: Garble(k) (a body, or stream
chunk k, cut off mid-JSON), NoLogprob(k) (a logprob entry without its `logprob`), BadIds(k) (a
token id that is a string), ErrorEvent(k) (stream k chunks, then vLLM's error event and [DONE]).

With `moe` it is a mixture-of-experts model and returns each token's routed experts in the
engine's own wire format (proxy/upstream/routed.py has the sources): vLLM (as if started with
--enable-return-routed-experts) per choice of a whole chat or completions answer, base64 of a
`.npy` array (tokens - 1, layers, top-k), never on a stream; SGLang when the request has
`return_routed_experts`, base64 of flat int32: in a whole chat answer's `choices[].meta_info`
(with `return_meta_info`) or response-level `sglext`, in a stream's final `sglext` chunk, in
`/generate`'s `meta_info` (the last event of a stream).

Every chat request's `X-Request-Id` is logged as `seen` when it arrives, and as `sent` (with the
prompt ids and each choice's ids) once its whole answer was written; `--log FILE` appends both as
JSON lines, so a test can read them after killing the process.

Run standalone for benchmarks: `python -m tests.support.fake_vllm --port 8300 [--token-delay-ms 2]`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import codecs
import functools
import io
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from aiohttp import web
from multidict import CIMultiDict

BOS, IM_START, IM_END = 0, 1, 2
OFFSET = 3
MODEL = "fake-model"
CONTEXT = 1_048_576
"""The context its model card claims: this fake spends a token per byte, so a harness's long
system prompt (Codex's) must still leave room to answer."""


VLLM_PLANE = (
    "/pause",
    "/resume",
    "/is_paused",
    "/start_weight_update",
    "/update_weights",
    "/finish_weight_update",
    "/update_weight_version",
    "/weight_info",
    "/weight_checker",
    "/init_weight_transfer_engine",
)
"""vLLM 0.33's RL control routes (vllm/entrypoints/rl/online/api_router.py)."""
SGLANG_PLANE = (
    "/pause_generation",
    "/continue_generation",
    "/update_weight_version",
    "/update_weights_from_distributed",
    "/model_info",
    "/weights_checker",
)
"""SGLang 0.5's counterparts (sglang/srt/entrypoints/http_server.py)."""
PLANE_ROUTES = sorted(
    {("GET", p) for p in ("/is_paused", "/weight_info", "/model_info")}
    | {
        ("POST", p)
        for p in (*VLLM_PLANE, *SGLANG_PLANE)
        if p not in ("/is_paused", "/weight_info", "/model_info")
    }
)


def encode(text: str) -> list[int]:
    return [b + OFFSET for b in text.encode()]


def decode(ids: list[int]) -> str:
    return bytes(i - OFFSET for i in ids if i >= OFFSET).decode(errors="replace")


def logprob_of(token_id: int) -> float:
    return -round(((token_id * 7) % 13) / 10 + 0.015625, 6)


@functools.cache
def _logprob_entry(token_id: int, as_ids: bool, top: int) -> dict[str, Any]:
    """One logprobs.content entry; cached, since the benchmark asks for the same ones a lot."""
    token = f"token_id:{token_id}" if as_ids else decode([token_id])
    entry = {"token": token, "logprob": logprob_of(token_id), "bytes": list(token.encode())}
    return {**entry, "top_logprobs": [entry][:top]}


def routed_experts(ids: list[int], layers: int, topk: int, experts: int) -> npt.NDArray[np.int32]:
    """The experts an MoE model routes each token of `ids` to, but the last (never forwarded):
    a function of the token and its position, so a prompt repeated later routes the same."""
    position = np.arange(len(ids) - 1, dtype=np.int64)[:, None, None]
    token = np.asarray(ids[:-1], dtype=np.int64)[:, None, None]
    layer = np.arange(layers, dtype=np.int64)[None, :, None]
    slot = np.arange(topk, dtype=np.int64)[None, None, :]
    return ((token * 7 + position * 13 + layer * 5 + slot * 3) % experts).astype(np.int32)


def vllm_routed_experts(array: npt.NDArray[np.int32]) -> str:
    """vLLM's encoding: base64 of the array's .npy file."""
    buffer = io.BytesIO()
    np.save(buffer, array)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def sglang_routed_experts(array: npt.NDArray[np.int32]) -> str:
    """SGLang's encoding: base64 of the raw int32 bytes, flattened, no shape."""
    return base64.b64encode(array.astype("<i4").tobytes()).decode("ascii")


def render(
    messages: list[dict[str, Any]], tools: list[Any] | None, generation_prompt: bool = True
) -> list[int]:
    ids = [BOS]
    if tools:
        ids += [IM_START, *encode("system\ntools: " + orjson.dumps(tools).decode()), IM_END]
    for m in messages:
        content = m.get("content") or ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if m.get("tool_calls"):
            content += "".join(
                "<tool_call>" + orjson.dumps(tc.get("function", {})).decode() + "</tool_call>"
                for tc in m["tool_calls"]
            )
        ids += [IM_START, *encode(f"{m.get('role')}\n{content}"), IM_END, *encode("\n")]
    return [*ids, IM_START, *encode("assistant\n")] if generation_prompt else ids


@dataclass(frozen=True)
class Refuse:
    """Close the connection before answering."""

    spec = "refuse"


@dataclass(frozen=True)
class Hang:
    """Never answer."""

    spec = "hang"


@dataclass(frozen=True)
class NoIds:
    """Answer without token ids, like a plain OpenAI server."""

    spec = "no_ids"


@dataclass(frozen=True)
class Status:
    """An error answer with this HTTP status."""

    code: int
    message: str | None = None

    @property
    def spec(self) -> str:
        return f"status:{self.code}" + ("" if self.message is None else f":{self.message}")


@dataclass(frozen=True)
class DieAfter:
    """Stream this many chunks, then drop the connection."""

    chunks: int

    @property
    def spec(self) -> str:
        return f"die_after:{self.chunks}"


@dataclass(frozen=True)
class ErrorEvent:
    """Stream this many chunks, then vLLM's error event and [DONE]."""

    chunks: int

    @property
    def spec(self) -> str:
        return f"error_event:{self.chunks}"


@dataclass(frozen=True)
class Garble:
    """A whole body, or stream chunk `chunk`, cut off mid-JSON."""

    chunk: int | None = None

    @property
    def spec(self) -> str:
        return "garble" if self.chunk is None else f"garble:{self.chunk}"


@dataclass(frozen=True)
class NoLogprob:
    """A logprob entry without its `logprob` (in a whole body, or in stream chunk `chunk`)."""

    chunk: int | None = None

    @property
    def spec(self) -> str:
        return "no_logprob" if self.chunk is None else f"no_logprob:{self.chunk}"


@dataclass(frozen=True)
class BadIds:
    """A token id that is a string (in a whole body, or in stream chunk `chunk`)."""

    chunk: int | None = None

    @property
    def spec(self) -> str:
        return "bad_ids" if self.chunk is None else f"bad_ids:{self.chunk}"


Fault = Refuse | Hang | NoIds | Status | DieAfter | ErrorEvent | Garble | NoLogprob | BadIds
Malformed = (Garble, NoLogprob, BadIds, ErrorEvent)
"""Faults after which the engine logs no `sent`: what it wrote is not the answer it planned."""


def parse_fault(spec: str) -> Fault | None:
    """A fault from its `spec` text; "none" (or "") is no fault."""
    kind, _, rest = spec.partition(":")
    chunk = int(rest) if rest.isdigit() else None
    match kind:
        case "" | "none":
            return None
        case "refuse":
            return Refuse()
        case "hang":
            return Hang()
        case "no_ids":
            return NoIds()
        case "status":
            code, _, message = rest.partition(":")
            return Status(int(code), message if message or rest.endswith(":") else None)
        case "die_after" if chunk is not None:
            return DieAfter(chunk)
        case "error_event" if chunk is not None:
            return ErrorEvent(chunk)
        case "garble":
            return Garble(chunk)
        case "no_logprob":
            return NoLogprob(chunk)
        case "bad_ids":
            return BadIds(chunk)
    raise ValueError(f"unknown fault {spec!r}")


def _stream_chunk(fault: Fault | None) -> int | None:
    """The stream chunk a fault strikes at, if it strikes a stream at all."""
    match fault:
        case DieAfter(chunks=k) | ErrorEvent(chunks=k):
            return k
        case Garble(chunk=k) | NoLogprob(chunk=k) | BadIds(chunk=k):
            return k
    return None


@dataclass
class Reply:
    text: str = "ok"
    tool_calls: list[dict[str, Any]] | None = None
    """[{"name": ..., "arguments": "<json string>", "id"?: ...}]: rendered as <tool_call> text."""
    fault: Fault | None = None
    token_delay: float = 0.0
    reasoning: str | None = None


def generated(reply: Reply, text: str) -> str:
    """What the model writes for `reply` whose visible text is `text`: its reasoning in
    <think>, then the text, then each tool call as a hermes <tool_call> block."""
    raw = text if reply.reasoning is None else f"<think>{reply.reasoning}</think>{text}"
    for tc in reply.tool_calls or ():
        call = {"name": tc["name"], "arguments": orjson.loads(tc["arguments"])}
        raw += "<tool_call>" + orjson.dumps(call).decode() + "</tool_call>"
    return raw


def default_script(body: dict[str, Any]) -> Reply:
    last = body["messages"][-1].get("content") or ""
    if isinstance(last, list):
        last = " ".join(p.get("text", "") for p in last if isinstance(p, dict))
    return Reply(text=f"echo: {str(last)[:40]}")


@dataclass(frozen=True)
class Sent:
    prompt: list[int]
    choices: list[list[int]]


def read_log(path: str) -> tuple[list[str], dict[str, Sent]]:
    """A `--log` file: request ids seen, and the answers sent whole."""
    seen: list[str] = []
    sent: dict[str, Sent] = {}
    if not os.path.exists(path):
        return seen, sent  # nothing served yet
    with open(path, "rb") as log:
        for line in log:
            if not line.endswith(b"\n"):
                break  # the line being written when the process died
            entry = orjson.loads(line)
            if "seen" in entry:
                seen.append(entry["seen"])
            else:
                sent[entry["sent"]] = Sent(entry["prompt"], entry["choices"])
    return seen, sent


@dataclass
class FakeVLLM:
    script: Callable[[dict[str, Any]], Reply] = default_script
    token_delay: float = 0.0
    healthy: bool = True
    requests: list[tuple[str, CIMultiDict[str], dict[str, Any]]] = field(default_factory=list)
    weight_version: str | None = None
    served: int = 0
    sglang: bool = False
    """Answer in SGLang 0.5's shapes instead: per-choice prompt_token_ids/response_token_ids/
    meta_info when not streaming (400 if asked while streaming), a final sglext chunk with
    input_ids/output_ids when streaming, reasoning as reasoning_content."""
    disconnects: int = 0
    """Answers cut short because the client (the proxy) closed the connection."""
    record_requests: bool = True
    seen: list[str] = field(default_factory=list)
    """X-Request-Id of every chat request received (kept when record_requests or log_path)."""
    sent: dict[str, Sent] = field(default_factory=dict)
    """X-Request-Id -> the ids of an answer written whole."""
    log_path: str | None = None
    weight_updates: list[dict[str, Any]] = field(default_factory=list)
    """Bodies of POST /update_weights_from_disk, in order."""
    refuse_weights: str | None = None
    """Answer weight updates with this failure message (HTTP 400, SGLang's shape)."""
    cache_resets: list[str] = field(default_factory=list)
    """Paths of the prefix-cache resets asked for (/flush_cache, /reset_prefix_cache), in order."""
    refuse_cache_reset: bool = False
    """Answer them as vLLM does when it cannot reset: 200 with `{"success": false}`."""
    aborts: int = 0
    """POST /abort_requests so far: answers running then end at once with finish_reason abort."""
    control: list[tuple[str, Any]] = field(default_factory=list)
    """(path, JSON body) of every /abort_requests, /flush_cache and /reset_prefix_cache."""
    planned: dict[tuple[int, ...], list[int]] = field(default_factory=dict)
    """Prompt -> the ids its answer was going to have: a completions request with that prompt
    plus a prefix of them (an aborted answer resumed token-in) gets the rest."""
    completion_text: str = "continued"
    """What any other token-in completions request is answered (then <|im_end|>)."""
    takes_prompt_ids: bool = True
    """The chat route samples from a token prompt sent with the request (vLLM 0.33's
    `kv_transfer_params.prompt_token_ids`, SGLang's `input_ids`); False: it ignores the field
    and renders the messages, as an older engine does."""
    completion_sampled: int = 0
    """Tokens the completions route has sampled so far (written, or counted toward a whole
    answer), for a test to act at a known point of an answer."""
    completion_script: Callable[[list[int]], Reply] | None = None
    """Instead of completion_text: the prompt ids -> the reply, written as the chat route
    writes one (reasoning, text, <tool_call> blocks) for the proxy's parsers to read."""
    moe: tuple[int, int, int] | None = None
    """(layers, top-k, experts): an MoE model, which returns routed experts (module doc)."""
    paused: str | None = None
    """The mode of the pause in force (vLLM's /pause, SGLang's /pause_generation), or None."""
    reported_version: str | None = None
    """Report this weight version (/weight_info, /model_info) whatever was set: an engine that
    did not take the update."""
    planes: list[tuple[str, Any]] = field(default_factory=list)
    """(`METHOD /path?query`, JSON body or None) of every control-plane call (pause, versions,
    resume, ...), in order."""
    refuse_keep: bool = False
    """Refuse to freeze requests (vLLM's 400 for pause mode=keep), as rolltap's engine does."""
    vllm_routes: Any = None
    """An ASGI app serving vLLM's own RL and cache routers (tests/support/vllm_plane.py): its
    control routes are answered there, so vLLM's route code reads what rolltap sent."""
    _thawed: asyncio.Event = field(default_factory=asyncio.Event)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)
    _running: int = 0

    def __post_init__(self) -> None:
        self._thawed.set()
        self._idle.set()

    # -- the control plane's effects, whoever parsed the request (here or vLLM's routers) ---

    async def pause_engine(self, mode: str) -> None:
        """vLLM's modes abort | wait | keep; SGLang's abort | retract | in_place."""
        self.paused = mode
        if mode in ("keep", "in_place", "retract"):
            self._thawed.clear()
        elif mode == "abort":
            self.aborts += 1
        if mode in ("wait", "abort"):
            await self._idle.wait()

    def resume_engine(self) -> None:
        self.paused = None
        self._thawed.set()

    def set_version(self, version: str) -> None:
        self.weight_version = version

    def version_read(self) -> str:
        if self.reported_version is not None:
            return self.reported_version
        return self.weight_version or "default"

    def checksums(self) -> dict[str, str]:
        """Per-parameter checksums of the weights served: a function of their version."""
        import hashlib

        label = self.version_read().encode()
        return {
            name: hashlib.sha256(label + name.encode()).hexdigest()[:16]
            for name in ("model.embed_tokens.weight", "model.norm.weight")
        }

    def routing(self, ids: list[int], body: dict[str, Any]) -> str | None:
        """The routed experts of prompt + answer `ids` in this engine's encoding, when sent."""
        if self.moe is None:
            return None
        array = routed_experts(ids, *self.moe)
        if not self.sglang:
            return vllm_routed_experts(array)
        return sglang_routed_experts(array) if body.get("return_routed_experts") else None

    def _log(self, request_id: str, sent: Sent | None = None) -> None:
        if not (self.record_requests or self.log_path):
            return
        if sent is None:
            self.seen.append(request_id)
            line: dict[str, Any] = {"seen": request_id}
        else:
            self.sent[request_id] = sent
            line = {"sent": request_id, "prompt": sent.prompt, "choices": sent.choices}
        if self.log_path:
            # One write per line: what reached the file survives the process being killed.
            with open(self.log_path, "ab") as log:
                log.write(orjson.dumps(line) + b"\n")

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024**2)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/update_weights_from_disk", self.update_weights)
        app.router.add_post("/abort_requests", self.abort_requests)
        app.router.add_post("/flush_cache", self.reset_cache)  # SGLang's
        app.router.add_post("/reset_prefix_cache", self.reset_cache)  # vLLM's dev-mode route
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/v1/tokenize", self.tokenize)  # SGLang's path
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        for method, path in PLANE_ROUTES:
            app.router.add_route(method, path, self.plane)
        return app

    async def plane(self, request: web.Request) -> web.Response:
        """The engines' RL control planes: vLLM's (through its own routers when `vllm_routes`
        is set) and SGLang's, acting on this fake's pause and version."""
        raw = await request.read()
        sent = orjson.loads(raw) if raw.strip() else None
        self.planes.append((f"{request.method} {request.path_qs}", sent))
        if self.vllm_routes is not None and request.path in VLLM_PLANE:
            return await _asgi(self.vllm_routes, request, raw)
        body = sent if isinstance(sent, dict) else {}
        path = request.path
        if path == "/pause":
            mode = request.query.get("mode", "abort")
            if mode == "keep" and self.refuse_keep:
                return web.json_response({"error": "cannot freeze"}, status=400)
            await self.pause_engine(mode)
            return web.json_response({"status": "paused"})
        if path == "/pause_generation":
            await self.pause_engine(str(body.get("mode", "abort")))
            return web.json_response({"message": "Generation paused successfully.", "status": "ok"})
        if path in ("/resume", "/continue_generation"):
            self.resume_engine()
            return web.json_response({"status": "resumed"})
        if path == "/finish_weight_update":
            if body.get("weight_version") is not None:
                self.set_version(str(body["weight_version"]))
            return web.json_response({"message": "Weight update finished"})
        if path == "/update_weight_version":
            self.set_version(str(body["new_version"]))
            return web.json_response({"success": True, "new_version": body["new_version"]})
        if path == "/update_weights_from_distributed":
            if body.get("weight_version") is not None:
                self.set_version(str(body["weight_version"]))
            return web.json_response({"success": True, "message": "updated"})
        if path in ("/weight_info", "/model_info"):
            return web.json_response({"weight_version": self.version_read()})
        if path == "/weight_checker":
            return web.json_response({"checksums": self.checksums()})
        if path == "/weights_checker":
            return web.json_response(
                {"success": True, "message": "", "per_engine_checksum": self.checksums()}
            )
        return web.json_response({"message": "ok"})

    async def update_weights(self, request: web.Request) -> web.Response:
        """SGLang's (and rolltap's engine's) weight update: records the order, sets the label."""
        body = orjson.loads(await request.read())
        self.weight_updates.append(body)
        if self.refuse_weights is not None:
            answer = {"success": False, "message": self.refuse_weights, "num_paused_requests": 0}
            return web.json_response(answer, status=400)
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        answer = {"success": True, "message": "loaded", "num_paused_requests": 0}
        return web.json_response({**answer, "weight_version": self.weight_version})

    async def reset_cache(self, request: web.Request) -> web.Response:
        """SGLang's /flush_cache or vLLM's /reset_prefix_cache (this fake caches nothing)."""
        self.cache_resets.append(request.path)
        self.control.append((request.path, orjson.loads(await request.read() or b"null")))
        return web.json_response({"success": not self.refuse_cache_reset})

    async def abort_requests(self, request: web.Request) -> web.Response:
        """vLLM's dev-mode abort-all: every answer being generated ends now with "abort"."""
        self.aborts += 1
        self.control.append((request.path, orjson.loads(await request.read() or b"null")))
        return web.json_response({})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """Token-in completions, answering the rest of a planned answer (see `planned`); an
        abort ends it as the chat route's (what was sampled, finish_reason "abort")."""
        body = orjson.loads(await request.read())
        if self.record_requests:
            self.requests.append((request.path, CIMultiDict(request.headers), body))
        prompt = list(body["prompt"])
        ids = self._rest_of(prompt)
        generation = self.aborts
        finish = "stop"
        # vLLM 0.33's completions: 16 tokens when max_tokens is left out or null (its
        # `normalize_null_max_tokens`); the proxy spells out what the context leaves.
        limit = body.get("max_tokens")
        limit = 16 if limit is None else limit
        if limit is not None and len(ids) > int(limit):
            ids, finish = ids[: int(limit)], "length"
        header = {"id": f"cmpl-{len(self.requests)}", "created": int(time.time()), "model": MODEL}
        delay = self.token_delay
        with_ids = body.get("return_token_ids") is True

        def choice(part: list[int], ended: str | None, first: bool) -> dict[str, Any]:
            entry: dict[str, Any] = {"index": 0, "text": decode(part)}
            entry["logprobs"] = _completion_logprobs(part) if "logprobs" in body else None
            entry["finish_reason"] = ended
            entry["stop_reason"] = None
            if with_ids:
                entry["token_ids"] = part
                if first:
                    entry["prompt_token_ids"] = prompt
            return entry

        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt) + len(ids),
        }

        def aborted_after(k: int) -> bool:
            if self.aborts == generation:
                return False
            # What a continuation of this prompt plus the first k ids is to get.
            self.planned[tuple(prompt)] = ids
            return True

        if not body.get("stream"):
            for k in range(len(ids)):
                if aborted_after(k):
                    ids, finish = ids[:k], "abort"
                    break
                self.completion_sampled += 1
                if delay:
                    await asyncio.sleep(delay)
            usage = {**usage, "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)}
            doc = {**header, "object": "text_completion", "choices": [choice(ids, finish, True)]}
            if (routing := self.routing(prompt + ids, body)) is not None:
                doc["choices"][0]["routed_experts"] = routing
            # orjson, as the chat route: the benchmark compares the two routes through the proxy.
            return web.Response(
                body=orjson.dumps({**doc, "usage": usage}), content_type="application/json"
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        base = {**header, "object": "text_completion"}
        for k, token in enumerate(ids):
            if aborted_after(k):
                chunk = {**base, "choices": [choice([], "abort", k == 0)]}
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
                ids = ids[:k]
                usage = {**usage, "completion_tokens": k, "total_tokens": len(prompt) + k}
                break
            ended = finish if k == len(ids) - 1 else None
            chunk = {**base, "choices": [choice([token], ended, k == 0)]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            self.completion_sampled += 1
            if delay:
                await asyncio.sleep(delay)
        if (body.get("stream_options") or {}).get("include_usage"):
            chunk = {**base, "choices": [], "usage": usage}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """SGLang's native token-in route: `input_ids` in; text, `output_ids` and `meta_info`
        out; a stream is cumulative (each event holds everything so far), as SGLang's default."""
        body = orjson.loads(await request.read())
        if self.record_requests:
            self.requests.append((request.path, CIMultiDict(request.headers), body))
        sampling = body.get("sampling_params") or {}
        unknown = sorted(set(sampling) - _SGLANG_SAMPLING)
        if unknown:  # SGLang's schema refuses what it does not know
            message = f"unknown field `{unknown[0]}`"
            return web.json_response({"error": {"message": message, "code": 400}}, status=400)
        prompt = list(body["input_ids"])
        ids = self._rest_of(prompt)
        finish: dict[str, Any] = {"type": "stop", "matched": IM_END}
        # SGLang: 128 tokens when max_new_tokens is left out, what the context leaves when null.
        limit = sampling.get("max_new_tokens", 128)
        if limit is not None and len(ids) > int(limit):
            ids, finish = ids[: int(limit)], {"type": "length", "length": int(limit)}
        rid = f"gen-{len(self.requests)}"

        def doc(part: list[int], ended: dict[str, Any] | None) -> dict[str, Any]:
            meta: dict[str, Any] = {
                "id": rid,
                "finish_reason": ended,
                "prompt_tokens": len(prompt),
                "completion_tokens": len(part),
                "cached_tokens": 0,
                "weight_version": self.weight_version or "default",
            }
            if body.get("return_logprob"):
                meta["output_token_logprobs"] = [[logprob_of(i), i, None] for i in part]
            if ended is not None and (routing := self.routing(prompt + part, body)) is not None:
                meta["routed_experts"] = routing
            return {"text": decode(part), "output_ids": part, "meta_info": meta}

        if not body.get("stream"):
            return web.json_response(doc(ids, finish))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for k in range(1, len(ids) + 1):
            event = doc(ids[:k], finish if k == len(ids) else None)
            await resp.write(b"data: " + orjson.dumps(event) + b"\n\n")
            if self.token_delay:
                await asyncio.sleep(self.token_delay)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _rest_of(self, prompt: list[int]) -> list[int]:
        for start, planned in self.planned.items():
            n = len(start)
            done = len(prompt) - n
            fits = 0 <= done <= len(planned) and prompt[:n] == list(start)
            if fits and prompt[n:] == planned[:done]:
                return planned[done:]
        if self.completion_script is not None:
            reply = self.completion_script(prompt)
            return [*encode(generated(reply, reply.text)), IM_END]
        return [*encode(self.completion_text), IM_END]

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": MODEL,
                        "object": "model",
                        "owned_by": "sglang" if self.sglang else "vllm",
                        "max_model_len": CONTEXT,
                    }
                ],
            }
        )

    async def tokenize(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        if self.record_requests:
            self.requests.append((request.path, CIMultiDict(request.headers), body))
        ids = render(body["messages"], body.get("tools"), body.get("add_generation_prompt", True))
        return web.json_response({"count": len(ids), "max_model_len": CONTEXT, "tokens": ids})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if self.record_requests:
            self.requests.append((request.path, CIMultiDict(request.headers), body))
        self.served += 1
        reply = self.script(body)
        header_fault = request.headers.get("x-fake-fault")
        fault = parse_fault(header_fault) if header_fault else reply.fault
        if isinstance(fault, Refuse):
            assert request.transport is not None
            request.transport.close()
            raise web.HTTPInternalServerError()
        if isinstance(fault, Status):
            return web.json_response(
                {
                    "error": {
                        "message": fault.message if fault.message is not None else "fake failure",
                        "type": "InternalServerError",
                        "code": fault.code,
                    }
                },
                status=fault.code,
            )
        if isinstance(fault, Hang):
            await asyncio.sleep(3600)
        with_ids = body.get("return_token_ids") is True and not isinstance(fault, NoIds)
        if self.sglang:
            if body.get("stream") and (
                body.get("return_token_ids") or body.get("return_meta_info")
            ):
                return web.json_response(
                    {"object": "error", "message": "return_token_ids is not supported with stream",
                     "type": "BadRequestError", "code": 400},
                    status=400,
                )  # fmt: skip
            with_ids = False
        n = int(body.get("n") or 1)
        prompt = render(body["messages"], body.get("tools"))
        transfer = body.get("kv_transfer_params") or {}
        given = body.get("input_ids") if self.sglang else transfer.get("prompt_token_ids")
        if given is not None and self.takes_prompt_ids:
            prompt = list(given)
        request_id = request.headers.get("X-Request-Id") or f"{self.served}"
        self._log(request_id)
        choices = [self._choice(reply, i, body, request_id) for i in range(n)]
        self.planned[tuple(prompt)] = choices[0]["ids"]
        if len(self.planned) > 64:  # recent answers are the ones resumed; a long run stays fast
            del self.planned[next(iter(self.planned))]
        header = {"id": f"chatcmpl-{request_id}", "created": int(time.time()), "model": MODEL}
        sent = Sent(prompt, [c["ids"] for c in choices])
        generation = self.aborts

        def aborted() -> bool:
            return self.aborts != generation

        self._running += 1
        self._idle.clear()
        try:
            if body.get("stream"):
                response = await self._stream(
                    request, body, header, prompt, choices, with_ids, fault, reply, aborted
                )
            else:
                response = await self._whole(
                    body, header, prompt, choices, with_ids, fault, reply, aborted
                )
        except (ConnectionResetError, asyncio.CancelledError):
            # aiohttp cancels the handler, or the next write fails, once the client left.
            if not isinstance(fault, DieAfter):
                self.disconnects += 1
            raise
        finally:
            self._running -= 1
            if self._running == 0:
                self._idle.set()
        if not isinstance(fault, Malformed):
            self._log(request_id, sent)
        return response

    async def _whole(
        self,
        body: dict[str, Any],
        header: dict[str, Any],
        prompt: list[int],
        choices: list[dict[str, Any]],
        with_ids: bool,
        fault: Fault | None,
        reply: Reply,
        aborted: Callable[[], bool],
    ) -> web.Response:
        delay = reply.token_delay or self.token_delay
        longest = max(len(c["ids"]) for c in choices)
        versions: list[str] = []
        for k in range(longest):
            await self._thawed.wait()
            versions.append(self.weight_version or "default")
            if aborted():
                # Ended with what was sampled so far, as vLLM answers an aborted request.
                choices = [_cut(c, k) for c in choices]
                break
            if delay:
                await asyncio.sleep(delay)
        out_choices = []
        for i, c in enumerate(choices):
            entry: dict[str, Any] = {"index": i, "message": self._said(c["message"])}
            entry["logprobs"] = self._logprobs(c["ids"], body) if body.get("logprobs") else None
            entry["finish_reason"] = c["finish_reason"]
            entry[self._stop_key] = None
            if with_ids:
                entry["token_ids"] = c["ids"]
            if body.get("return_weight_versions") and not self.sglang:
                entry["weight_versions"] = spans(versions, len(c["ids"]))
            if self.sglang and body.get("return_token_ids"):
                entry["prompt_token_ids"] = prompt
                entry["response_token_ids"] = c["ids"]
                entry["meta_info"] = {"weight_version": self.weight_version or "default"}
            routing = self.routing(prompt + c["ids"], body)
            if routing is not None and not self.sglang:
                entry["routed_experts"] = routing
            elif routing is not None and body.get("return_meta_info"):
                entry.setdefault("meta_info", {})["routed_experts"] = routing
            out_choices.append(entry)
        completion = sum(len(c["ids"]) for c in choices)
        payload: dict[str, Any] = {
            **header,
            "object": "chat.completion",
            "choices": out_choices,
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": completion,
                "total_tokens": len(prompt) + completion,
            },
        }
        if with_ids:
            payload["prompt_token_ids"] = prompt
        routing = self.routing(prompt + choices[0]["ids"], body)
        if self.sglang and routing is not None and not body.get("return_meta_info"):
            payload["sglext"] = {"routed_experts": routing}  # response level: the first choice's
        if isinstance(fault, NoLogprob) and out_choices[0]["logprobs"]:
            _drop_logprob(out_choices[0])
        if isinstance(fault, BadIds):
            out_choices[0]["token_ids"] = [*out_choices[0].get("token_ids", ()), "not-an-id"]
        raw = orjson.dumps(payload)
        if isinstance(fault, Garble):
            raw = raw[: len(raw) // 2]
        return web.Response(body=raw, content_type="application/json")

    @property
    def _stop_key(self) -> str:
        """vLLM's `stop_reason` is SGLang's `matched_stop`."""
        return "matched_stop" if self.sglang else "stop_reason"

    def _said(self, message: dict[str, Any]) -> dict[str, Any]:
        """A message or delta as the engine names its parts: SGLang's `reasoning_content`."""
        if not self.sglang or "reasoning" not in message:
            return message
        renamed = {k: v for k, v in message.items() if k != "reasoning"}
        return {**renamed, "reasoning_content": message["reasoning"]}

    def _choice(
        self, reply: Reply, index: int, body: dict[str, Any], request_id: str
    ) -> dict[str, Any]:
        text = reply.text if index == 0 else f"{reply.text} #{index}"
        message: dict[str, Any] = {"role": "assistant", "content": text}
        raw = generated(reply, text)
        finish = "stop"
        if reply.reasoning is not None:
            message["reasoning"] = reply.reasoning
        if reply.tool_calls:
            calls = []
            for k, tc in enumerate(reply.tool_calls):
                calls.append(
                    {
                        "id": tc.get("id") or f"call_{request_id}_{index}_{k}",
                        "type": "function",
                        "function": {"name": tc["name"], "arguments": tc["arguments"]},
                    }
                )
            message["tool_calls"] = calls
            message["content"] = text or None
            finish = "tool_calls"
        ids = encode(raw)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        if max_tokens is not None and len(ids) >= int(max_tokens):
            ids = ids[: int(max_tokens)]
            message = {"role": "assistant", "content": decode(ids)}
            finish = "length"
        else:
            ids.append(IM_END)
        return {"ids": ids, "message": message, "finish_reason": finish}

    @staticmethod
    def _logprobs(ids: list[int], body: dict[str, Any]) -> dict[str, Any]:
        top = min(1, int(body.get("top_logprobs") or 0))
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        return {"content": [_logprob_entry(i, as_ids, top) for i in ids]}

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        header: dict[str, Any],
        prompt: list[int],
        choices: list[dict[str, Any]],
        with_ids: bool,
        fault: Fault | None,
        reply: Reply,
        aborted: Callable[[], bool],
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        versions: list[str] = []
        """The version in force as each step's tokens were sampled."""
        fault_at = _stream_chunk(fault)
        delay = reply.token_delay or self.token_delay
        sent = 0
        chunk_base = {**header, "object": "chat.completion.chunk"}

        async def send(obj: dict[str, Any]) -> None:
            nonlocal sent
            if sent == fault_at and isinstance(fault, DieAfter):
                assert request.transport is not None
                request.transport.abort()
                raise ConnectionResetError("fake engine died")
            if sent == fault_at and isinstance(fault, ErrorEvent):
                error = {"message": "fake failure mid-stream", "type": "InternalServerError"}
                await resp.write(b"data: " + orjson.dumps({"error": {**error, "code": 500}}))
                await resp.write(b"\n\ndata: [DONE]\n\n")
                raise _Ended
            if sent == fault_at and isinstance(fault, NoLogprob):
                for choice in obj["choices"]:
                    _drop_logprob(choice)
            if sent == fault_at and isinstance(fault, BadIds):
                for choice in obj["choices"]:
                    choice["token_ids"] = ["not-an-id"]
            raw = orjson.dumps(obj)
            if sent == fault_at and isinstance(fault, Garble):
                raw = raw[: len(raw) // 2]
            await resp.write(b"data: " + raw + b"\n\n")
            sent += 1

        try:
            for i, _ in enumerate(choices):
                first: dict[str, Any] = {
                    **chunk_base,
                    "choices": [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
                if with_ids:
                    first["prompt_token_ids"] = prompt
                await send(first)
            # One chunk per token, choices interleaved, like vLLM's per-step output.
            streams = [self._token_deltas(c) for c in choices]
            for k, step in enumerate(itertools.zip_longest(*streams)):
                await self._thawed.wait()  # frozen in place (keep / in_place) until resumed
                versions.append(self.weight_version or "default")
                if aborted():
                    choices = [_cut(c, k) for c in choices]
                    break
                for i, item in enumerate(step):
                    if item is None:
                        continue
                    token_id, delta = item
                    delta = self._said(delta)
                    entry: dict[str, Any] = {"index": i, "delta": delta, "finish_reason": None}
                    entry["logprobs"] = (
                        self._logprobs([token_id], body) if body.get("logprobs") else None
                    )
                    if with_ids:
                        entry["token_ids"] = [token_id]
                    await send({**chunk_base, "choices": [entry]})
                if delay:
                    await asyncio.sleep(delay)
            for i, c in enumerate(choices):
                final: dict[str, Any] = {"index": i, "delta": {}, "logprobs": None}
                final["finish_reason"] = c["finish_reason"]
                final[self._stop_key] = None
                if with_ids:
                    final["token_ids"] = []
                if body.get("return_weight_versions") and not self.sglang:
                    final["weight_versions"] = spans(versions, len(c["ids"]))
                await send({**chunk_base, "choices": [final]})
            # SGLang writes its sglext chunk before the usage chunk (serving_chat.py).
            sglext: dict[str, Any] = {}
            routing = self.routing(prompt + choices[0]["ids"], body)
            if self.sglang and routing is not None:
                sglext["routed_experts"] = routing
            if self.sglang and body.get("return_output_ids_in_sglext"):
                sglext |= {"input_ids": prompt, "output_ids": [c["ids"] for c in choices]}
            if sglext:
                await send({**chunk_base, "choices": [], "sglext": sglext})
            if (body.get("stream_options") or {}).get("include_usage"):
                completion = sum(len(c["ids"]) for c in choices)
                await send(
                    {
                        **chunk_base,
                        "choices": [],
                        "usage": {
                            "prompt_tokens": len(prompt),
                            "completion_tokens": completion,
                            "total_tokens": len(prompt) + completion,
                        },
                    }
                )
            await resp.write(b"data: [DONE]\n\n")
        except _Ended:
            pass  # the fault wrote the stream's end itself
        await resp.write_eof()
        return resp

    @staticmethod
    def _token_deltas(choice: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
        """Each sampled token with the delta a streaming parser would emit for it."""
        message = choice["message"]
        deltas: list[tuple[int, dict[str, Any]]] = []
        for kind, text, extra in _segments(message):
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            arguments = list(extra.get("arguments", ""))
            for position, token_id in enumerate(encode(text)):
                if kind in ("reasoning", "content"):
                    piece = decoder.decode(bytes([token_id - OFFSET]))
                    deltas.append((token_id, {kind: piece} if piece else {}))
                elif kind == "tool" and position == 0:
                    head = {**extra["head"], "function": {**extra["head"]["function"]}}
                    head["function"]["arguments"] = ""
                    deltas.append((token_id, {"tool_calls": [head]}))
                elif kind == "tool" and arguments:
                    fragment = {"index": extra["head"]["index"], "function": {}}
                    fragment["function"]["arguments"] = arguments.pop(0)
                    deltas.append((token_id, {"tool_calls": [fragment]}))
                else:
                    # Markup the parser holds back; the chunk is still sent with its id (§1.3).
                    deltas.append((token_id, {}))
            if arguments:
                raise AssertionError("fake engine: tool arguments longer than their markup")
        ids = [token_id for token_id, _ in deltas]
        if ids != choice["ids"][: len(ids)]:
            raise AssertionError("fake engine: deltas out of step with the sampled ids")
        # The end-of-turn token (or nothing, when cut by max_tokens).
        deltas += [(token_id, {}) for token_id in choice["ids"][len(ids) :]]
        return deltas


class _Ended(Exception):
    """A fault ended the stream early (and wrote its end)."""


def spans(versions: list[str], length: int) -> list[dict[str, Any]]:
    """vLLM's `weight_versions`: contiguous [start, end) ranges of the output per label."""
    out: list[dict[str, Any]] = []
    for k, version in enumerate(versions[:length]):
        if out and out[-1]["version"] == version:
            out[-1]["end"] = k + 1
        else:
            out.append({"version": version, "start": k, "end": k + 1})
    return out


async def _asgi(app: Any, request: web.Request, raw: bytes) -> web.Response:
    """`request` answered by an ASGI app (vLLM's FastAPI routers), in process: one HTTP/1.1
    request as an ASGI scope, its answer collected from the `send` messages."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.path.encode(),
        "query_string": request.query_string.encode(),
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in request.headers.items()],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 80),
    }
    sent = False
    status, headers, body = 500, [], bytearray()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)  # no disconnect while the route runs
        sent = True
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status, headers = message["status"], message.get("headers", [])
        elif message["type"] == "http.response.body":
            body.extend(message.get("body", b""))

    await app(scope, receive, send)
    kind = dict(headers).get(b"content-type", b"application/json").decode().split(";")[0]
    return web.Response(body=bytes(body), status=status, content_type=kind)


def _drop_logprob(choice: dict[str, Any]) -> None:
    """Remove the `logprob` of the choice's first logprob entry (a malformed engine answer)."""
    logprobs = choice.get("logprobs")
    if logprobs and logprobs.get("content"):
        content = [dict(e) for e in logprobs["content"]]
        del content[0]["logprob"]
        choice["logprobs"] = {**logprobs, "content": content}


def _segments(message: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """The raw output split by what a parser makes of each part: (kind, text, extra)."""
    if message.get("reasoning") is None and not message.get("tool_calls"):
        return [("content", message.get("content") or "", {})]
    segments: list[tuple[str, str, dict[str, Any]]] = []
    if message.get("reasoning") is not None:
        segments += [
            ("markup", "<think>", {}),
            ("reasoning", message["reasoning"], {}),
            ("markup", "</think>", {}),
        ]
    segments.append(("content", message.get("content") or "", {}))
    for k, tc in enumerate(message.get("tool_calls") or ()):
        function = tc["function"]
        markup = (
            "<tool_call>"
            + orjson.dumps(
                {"name": function["name"], "arguments": orjson.loads(function["arguments"])}
            ).decode()
            + "</tool_call>"
        )
        segments.append(
            ("tool", markup, {"head": {"index": k, **tc}, "arguments": function["arguments"]})
        )
    return segments


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8300)
    parser.add_argument("--token-delay-ms", type=float, default=0.0)
    parser.add_argument("--reply-tokens", type=int, default=0, help="answer this many tokens")
    parser.add_argument("--log", help="append seen/sent request ids here (JSON lines)")
    args = parser.parse_args()
    text = "x" * max(0, args.reply_tokens - 1)

    def script(body: dict[str, Any]) -> Reply:
        reply = Reply(text=text) if args.reply_tokens else default_script(body)
        # A client picks a fault for its call with "fault=<spec>" in its last message.
        last = str(body["messages"][-1].get("content") or "")
        if "fault=" in last:
            reply.fault = parse_fault(last.split("fault=", 1)[1].split()[0])
        return reply

    fake = FakeVLLM(
        script=script,
        # Token-in calls (the proxy's --token-in mode) get answers as long as chat calls.
        completion_text=text if args.reply_tokens else "continued",
        token_delay=args.token_delay_ms / 1000,
        record_requests=False,
        log_path=args.log,
    )
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(
        fake.app(),
        host="127.0.0.1",
        port=args.port,
        print=None,
        access_log=None,
        handler_cancellation=True,
    )


_SGLANG_SAMPLING = frozenset(
    {
        "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
        "frequency_penalty", "repetition_penalty", "stop", "stop_token_ids", "ignore_eos",
        "skip_special_tokens", "sampling_seed", "no_stop_trim", "n",
    }
)  # fmt: skip
"""SGLang's `sampling_params` fields the fake knows (SGLang answers others with a 400)."""


def _cut(choice: dict[str, Any], k: int) -> dict[str, Any]:
    """A choice aborted after its first k tokens (plain text answers only)."""
    ids = choice["ids"][:k]
    message = {"role": "assistant", "content": decode(ids)}
    return {"ids": ids, "message": message, "finish_reason": "abort"}


@functools.cache
def _token_text(token_id: int) -> str:
    return decode([token_id])


def _completion_logprobs(ids: list[int]) -> dict[str, Any]:
    """The completions route's logprobs: parallel lists, as vLLM's /v1/completions gives."""
    tokens = [_token_text(i) for i in ids]
    return {
        "tokens": tokens,
        "token_logprobs": [logprob_of(i) for i in ids],
        "top_logprobs": [{t: logprob_of(i)} for t, i in zip(tokens, ids, strict=True)],
        "text_offset": list(itertools.accumulate([0, *map(len, tokens[:-1])]))[: len(ids)],
    }


if __name__ == "__main__":
    main()
