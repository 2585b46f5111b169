"""MoE routing replay (R3): the experts each token was routed to, asked of the engine with the
tokens and read back from its answer, exactly as it sent them.

What the engines send (read in their sources, Nov 2026; facts only, our own code):

vLLM 0.33 (vllm-project/vllm)
  * No request field turns it on: the server flag `--enable-return-routed-experts`
    (`ModelConfig.enable_return_routed_experts`) does, for every request. The one request field
    is `routed_experts_prompt_start` (int, default 0: skip that many prompt tokens; vllm#51906),
    on `ChatCompletionRequest` and `CompletionRequest`
    (vllm/entrypoints/openai/chat_completion/protocol.py, .../completion/protocol.py).
  * Where: `choices[].routed_experts` of a whole answer, chat (`ChatCompletionResponseChoice`)
    and completions (`CompletionResponseChoice`), one per choice. Encoding: a string, base64 of
    the `.npy` file of a numpy array (`np.save`; decode `np.load(io.BytesIO(b64decode(s)))`) of
    shape (num_tokens - 1, num_layers, num_experts_per_tok), dtype uint8/uint16/int32, covering
    prompt and answer: the last sampled token was never forwarded, so it has no row; null when
    the server flag is off or the request was aborted before any forward pass
    (`numpy2base64(output.routed_experts)` in .../chat_completion/serving.py,
    `chat_completion_full_generator`).
  * Streaming: `ChatCompletionResponseStreamChoice` and `CompletionResponseStreamChoice` have no
    such field and the stream generator sets none: a stream carries no routed experts (RFC
    vllm#56745, open). Only `/inference/v1/generate` streams them (vllm#44638), which rolltap
    does not use.

SGLang (sgl-project/sglang, python/sglang/srt/entrypoints/openai/protocol.py, serving_chat.py)
  * Request: `return_routed_experts: true` (and `routed_experts_start_len`, default 0) on
    `ChatCompletionRequest`, `CompletionRequest` and `/generate`'s `GenerateReqInput`; the server
    must also run with `--enable-return-routed-experts`.
  * Encoding: base64 of the raw bytes of an int32 array (`pybase64.b64encode(t.numpy().tobytes())`
    in the tokenizer manager), flattened C-order from logical shape (seqlen - 1 -
    routed_experts_start_len, num_layers, top_k): prompt and answer, no shape sent. rolltap
    records it as (rows, num_layers * top_k): the split of a row into layers and top-k is the
    model's (its config), which the trainer knows.
  * Chat, whole answer: response-level `sglext.routed_experts` (`SglExt`), or, when the request
    has `return_meta_info` (as rolltap's non-streaming requests do), `choices[].meta_info
    .routed_experts` instead (`_build_chat_response`).
  * Chat, streaming: one chunk `{"choices": [], "sglext": {"routed_experts": ...}}` after the
    finish_reason chunks (merged with `input_ids`/`output_ids` when those are asked for), before
    the usage chunk.
  * `/generate`: `meta_info.routed_experts`, whole or on the final (finished) event of a stream.

rolltap stores them packed (uint8 when every expert id is below 256, uint16 below 65536, int32
otherwise, e.g. negative placeholders), with their shape (store/routed.py).
"""

from __future__ import annotations

import base64
import binascii
import enum
import io
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

SGLANG_FIELD = "return_routed_experts"


class Source(enum.StrEnum):
    VLLM = "vllm"
    """Base64 of a `.npy` file, shape (tokens - 1, layers, top-k)."""
    SGLANG = "sglang"
    """Base64 of flat int32, (tokens - 1) x (layers * top-k) with no shape sent."""


@dataclass(frozen=True)
class RawRouting:
    """One choice's routed experts as they came in the engine's answer (not yet decoded)."""

    source: Source
    payload: object


DENSE = (
    "the built-in engine runs a dense model: it has no routed experts to capture "
    "(--capture-routed-experts needs an MoE model on sglang=URL, or on vLLM started with "
    "--enable-return-routed-experts)"
)


def refusal(kinds: Iterable[str], builtin: bool) -> str | None:
    """Why calls on these backends cannot capture routed experts; None when they can."""
    if builtin:
        return DENSE
    if any(kind == "openai" for kind in kinds):
        return (
            "an openai=URL backend returns no routed experts: --capture-routed-experts needs "
            "sglang=URL or a vLLM backend (started with --enable-return-routed-experts)"
        )
    return None


def found(doc: dict[str, Any]) -> Iterator[tuple[int, RawRouting]]:
    """(choice index, routing) for every routed-experts payload in one answer or chunk."""
    sglext = doc.get("sglext")
    if isinstance(sglext, dict) and sglext.get("routed_experts") is not None:
        # Response-level: SGLang gives the first choice's (one per request).
        yield 0, RawRouting(Source.SGLANG, sglext["routed_experts"])
    for choice in doc.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        index = int(choice.get("index") or 0)
        if choice.get("routed_experts") is not None:
            yield index, RawRouting(Source.VLLM, choice["routed_experts"])
        meta = choice.get("meta_info")
        if isinstance(meta, dict) and meta.get("routed_experts") is not None:
            yield index, RawRouting(Source.SGLANG, meta["routed_experts"])


def decode(raw: RawRouting, tokens: int) -> npt.NDArray[Any]:
    """The routing of a choice whose prompt plus answer is `tokens` long, packed; ValueError
    when it cannot be read. vLLM's keeps its shape; SGLang's is split into tokens - 1 rows."""
    if raw.source is Source.VLLM:
        array = _npy(raw.payload)
    else:
        flat = _int32(raw.payload)
        rows = tokens - 1
        if rows <= 0 or flat.size % rows:
            raise ValueError(f"{flat.size} expert ids do not split into {rows} token rows")
        array = flat.reshape(rows, flat.size // rows)
    if array.ndim not in (2, 3):
        raise ValueError(f"routed experts of shape {array.shape}, not tokens x layers x top-k")
    return packed(array)


def packed(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Expert ids in the narrowest dtype that holds them exactly: uint8, uint16, else int32."""
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"expert ids of dtype {array.dtype}, not integers")
    if array.size == 0:
        return np.ascontiguousarray(array, dtype=np.uint8)
    low, high = int(array.min()), int(array.max())
    for dtype in (np.uint8, np.uint16):
        if low >= 0 and high <= np.iinfo(dtype).max:
            return np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder("<"))
    if low < np.iinfo(np.int32).min or high > np.iinfo(np.int32).max:
        raise ValueError("expert ids beyond int32")
    return np.ascontiguousarray(array, dtype=np.dtype("<i4"))


def _b64(payload: object) -> bytes:
    if not isinstance(payload, str):
        raise ValueError(f"routed experts as {type(payload).__name__}, not a base64 string")
    try:
        return base64.b64decode(payload, validate=True)
    except binascii.Error as e:
        raise ValueError(f"routed experts are not base64: {e}") from None


def _npy(payload: object) -> npt.NDArray[Any]:
    if isinstance(payload, list):  # nested lists, as vLLM's earliest R3 builds sent them
        return np.asarray(payload)
    array = np.load(io.BytesIO(_b64(payload)), allow_pickle=False)
    if not isinstance(array, np.ndarray):
        raise ValueError("routed experts are not one .npy array")
    return array


def _int32(payload: object) -> npt.NDArray[np.int32]:
    data = _b64(payload)
    if len(data) % 4:
        raise ValueError(f"{len(data)} bytes of routed experts are not int32 values")
    return np.frombuffer(data, dtype="<i4")
