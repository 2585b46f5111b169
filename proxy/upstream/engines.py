"""Per backend kind: what to add to a chat request for token capture, and where ids come back.

vLLM (and rolltap's built-in engine, which speaks vLLM's dialect): `return_token_ids` gives a
top-level `prompt_token_ids` and per-choice `token_ids` (per chunk when streaming). SGLang:
non-streaming `return_prompt_token_ids`/`return_token_ids` give per-choice `prompt_token_ids` and
`response_token_ids`; streaming `return_input_ids_in_sglext`/`return_output_ids_in_sglext` add a
final `{"choices": [], "sglext": {...}}` chunk. A plain OpenAI-compatible server gets the request
unchanged and its calls are recorded as text only.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from . import routed


class EngineKind(enum.StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    OPENAI = "openai"


@dataclass(frozen=True)
class Extras:
    """What rolltap added to the engine request that the client did not ask for."""

    token_ids: bool = True
    logprobs: bool = True
    meta_info: bool = False
    """SGLang's per-choice meta_info (asked for its ids)."""
    routed_experts: bool = False
    """Routed experts (proxy/upstream/routed.py): vLLM's per choice, SGLang's `sglext`."""
    weight_versions: bool = False
    """vLLM's per-choice `weight_versions` spans (which weights sampled which tokens)."""


@dataclass(frozen=True)
class Prepared:
    body: dict[str, Any]
    """The request to send to the engine."""
    extras: Extras
    """What the client did not ask for and must not see."""
    usage_chunk_for_client: bool
    """Whether the client asked for the streaming usage chunk (rolltap always asks)."""
    path: str | None = None
    """The engine route to send it to; None: the caller's (chat completions)."""


def ask_routed_experts(prepared: Prepared, kind: EngineKind) -> Prepared:
    """The engine request asking for routed experts, and the client's view stripped of them.

    SGLang takes `return_routed_experts` on chat and `/generate` alike. vLLM has no request
    field (its server flag decides), so its request is unchanged, as is an openai=URL one's
    (admission refuses such backends; one added later answers without, which is noted)."""
    body = prepared.body
    if kind == "sglang":
        body = {**body, routed.SGLANG_FIELD: True}
    extras = dataclasses.replace(prepared.extras, routed_experts=True)
    return dataclasses.replace(prepared, body=body, extras=extras)


def prepare_chat(body: dict[str, Any], kind: EngineKind) -> Prepared:
    engine = dict(body)
    asked_logprobs = body.get("logprobs") is True
    asked_ids = body.get("return_token_ids") is True
    stream = body.get("stream") is True
    options = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
    asked_usage = bool(options.get("include_usage")) if options else False
    # `include_reasoning: false` makes vLLM null every id and logprob ("would leak reasoning").
    if engine.get("include_reasoning") is False:
        del engine["include_reasoning"]
    if kind is EngineKind.OPENAI:
        return Prepared(engine, Extras(token_ids=False, logprobs=False), asked_usage)
    engine["logprobs"] = True
    if not asked_logprobs:
        engine["top_logprobs"] = 0
    if stream:
        engine["stream_options"] = {**(options or {}), "include_usage": True}
    if kind is EngineKind.VLLM:
        engine["return_token_ids"] = True
        # Which weights sampled which tokens: an answer frozen across an in_place update has
        # two versions, which only the engine can place exactly.
        asked_spans = body.get("return_weight_versions") is True
        engine["return_weight_versions"] = True
        extras = Extras(
            token_ids=not asked_ids, logprobs=not asked_logprobs, weight_versions=not asked_spans
        )
        return Prepared(engine, extras, asked_usage)
    if stream:
        engine["return_input_ids_in_sglext"] = True
        engine["return_output_ids_in_sglext"] = True
    else:
        engine["return_prompt_token_ids"] = True
        engine["return_token_ids"] = True
        engine["return_meta_info"] = True
    extras = Extras(token_ids=not asked_ids, logprobs=not asked_logprobs, meta_info=not stream)
    return Prepared(engine, extras, asked_usage)


@dataclass
class ChoiceCapture:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    has_ids: bool = False
    finish_reason: str | None = None
    weight_spans: list[list[Any]] = field(default_factory=list)
    """[[version, start, end], ...] over its sampled tokens, as vLLM's `weight_versions` gave
    them (on a stream's last chunk: they cover the whole answer)."""


@dataclass
class Captured:
    """Ids and logprobs of one engine answer, as the engine reported them."""

    prompt_ids: list[int] | None = None
    choices: dict[int, ChoiceCapture] = field(default_factory=dict)
    weight_version: str | None = None
    routing: dict[int, routed.RawRouting] = field(default_factory=dict)
    """Each choice's routed experts as the engine sent them (proxy/upstream/routed.py)."""
    tool_parse: str | None = None
    """Whether the answer's tool calls parsed, where rolltap's token-in parsers or its built-in
    engine read them (a choice's `tool_parse`); the first choice's outcome."""

    def choice(self, index: int) -> ChoiceCapture:
        found = self.choices.get(index)
        if found is None:
            found = self.choices[index] = ChoiceCapture()
        return found


_LOGPROB = itemgetter("logprob")


def capture_response(doc: dict[str, Any], captured: Captured) -> None:
    """Collect ids/logprobs from a non-streaming response or one streaming chunk."""
    for index, raw in routed.found(doc):
        captured.routing[index] = raw
    if isinstance(doc.get("prompt_token_ids"), list):
        captured.prompt_ids = doc["prompt_token_ids"]
    sglext = doc.get("sglext")
    if isinstance(sglext, dict):
        if isinstance(sglext.get("input_ids"), list):
            captured.prompt_ids = sglext["input_ids"]
        outputs = sglext.get("output_ids")
        if isinstance(outputs, list):
            for index, ids in enumerate(outputs):
                c = captured.choice(index)
                c.token_ids = list(ids)
                c.has_ids = True
    for choice in doc.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        c = captured.choice(int(choice.get("index") or 0))
        ids = choice.get("token_ids")
        if ids is None:
            ids = choice.get("response_token_ids")
        if isinstance(ids, list):
            c.token_ids.extend(ids)
            c.has_ids = True
        if captured.prompt_ids is None and isinstance(choice.get("prompt_token_ids"), list):
            captured.prompt_ids = choice["prompt_token_ids"]
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            # map in C, not a generator frame per token: a 200-token answer 143 K -> 106 K
            # instructions (callgrind), the same values and errors.
            c.logprobs.extend(map(float, map(_LOGPROB, logprobs["content"])))
        if choice.get("finish_reason") is not None:
            c.finish_reason = choice["finish_reason"]
        if isinstance(choice.get("tool_parse"), str) and captured.tool_parse is None:
            captured.tool_parse = choice["tool_parse"]
        spans = choice.get("weight_versions")
        version = _last_version(spans)
        if version is not None:
            captured.weight_version = version
        if isinstance(spans, list) and spans and isinstance(spans[0], dict):
            c.weight_spans = [[str(s["version"]), int(s["start"]), int(s["end"])] for s in spans]
        meta = choice.get("meta_info")
        if isinstance(meta, dict) and meta.get("weight_version") is not None:
            captured.weight_version = str(meta["weight_version"])


def _last_version(spans: object) -> str | None:
    """The newest label in vLLM's `weight_versions` ([{version, start, end}, ...] per choice, as
    rolltap's engine also answers) or in a plain list of labels."""
    if not isinstance(spans, list) or not spans:
        return None
    last = spans[-1]
    if isinstance(last, dict):
        return None if last.get("version") is None else str(last["version"])
    return str(last)
