"""Token strips: a call's tokens with their text, the loss mask, logprob colours and drift marks.

Token text comes from a `Detokenizer` (the one drift classification uses), one id at a time and
remembered, since a vocabulary is finite. Which tokenizer: the one given to `rolltap ui
--tokenizer`, else the built-in engine's for rollouts of the built-in model; without one, the
strip shows ids.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from ..analysis.detokenizer import HFDetokenizer
from ..analysis.drift import DetokenizeFailed, Detokenizer
from ..engine import gguf_cache
from .layout import Mark, SegmentTokens, Span

PAGE = 2048
"""Most tokens one strip request renders."""
CONTEXT_TAIL = 256
"""Tokens of a call's added context shown before its answer; the rest loads on demand."""
_SPECIAL = re.compile(r"^<\|[^|>]{1,40}\|>$|^</?s>$")
# Probability bands, most likely first: the strip's colour scale.
_BANDS = (0.9, 0.6, 0.3, 0.1, 0.01)


class TokenTexts:
    """Each token id's text, decoded once."""

    def __init__(self, detokenizer: Detokenizer) -> None:
        self.detokenizer = detokenizer
        self._known: dict[int, str] = {}

    async def texts(self, ids: Sequence[int]) -> list[str]:
        missing = sorted({i for i in ids if i not in self._known})
        if missing:
            decoded = await self.detokenizer.detokenize(
                [np.array([i], dtype=np.int32) for i in missing]
            )
            self._known.update(zip(missing, decoded, strict=True))
        return [self._known[i] for i in ids]


class TokenSource(Protocol):
    """Which token texts a rollout's strips use (None: show ids)."""

    async def for_model(self, model: str | None) -> TokenTexts | None: ...

    async def preload(self) -> None: ...


class Tokenizers:
    """The tokenizer for a rollout's model, loaded on first use."""

    def __init__(self, path: Path | None, builtin: tuple[str, Path] | None) -> None:
        """`path`: one tokenizer for every rollout; `builtin`: (model name, GGUF file) of the
        built-in engine, used for rollouts of that model when no path is given."""
        self._path = path
        self._builtin = builtin
        self._loaded: dict[Path, TokenTexts | None] = {}
        self._lock = asyncio.Lock()

    async def preload(self) -> None:
        """Load the tokenizer given by path now, so the first page does not wait for it."""
        if self._path is not None:
            await self.for_model(None)

    async def for_model(self, model: str | None) -> TokenTexts | None:
        path = self._path
        if path is None and self._builtin is not None and model == self._builtin[0]:
            path = self._builtin[1]
        if path is None:
            return None
        async with self._lock:
            if path not in self._loaded:
                self._loaded[path] = await asyncio.to_thread(_load, path)
            return self._loaded[path]


def _load(path: Path) -> TokenTexts | None:
    # Parsing a GGUF's vocabulary takes transformers many seconds; the built-in engine keeps
    # the same tokenizer in its cache entry as a folder, which loads in a fraction of that.
    cached = gguf_cache.lookup(path) if path.suffix == ".gguf" else None
    try:
        return TokenTexts(HFDetokenizer.from_path(cached or path))
    except (DetokenizeFailed, ImportError):
        return None


@dataclass(frozen=True)
class Token:
    text: str
    css: str
    title: str
    mark: Mark | None
    """A later segment branches off before this token."""


@dataclass(frozen=True)
class Strip:
    span: Span
    lo: int
    hi: int
    tokens: list[Token]
    earlier: tuple[int, int] | None
    """The range of the call's tokens before this window, when there are any."""
    later: tuple[int, int] | None


def window(span: Span, lo: int | None = None, hi: int | None = None) -> tuple[int, int]:
    """The tokens a strip request shows: by default the answer and the context just before it."""
    if lo is None and hi is None:
        lo = max(span.context_start, span.start - CONTEXT_TAIL)
    if lo is None:
        lo = max(span.context_start, (hi or span.end) - PAGE)
    lo = min(max(lo, span.context_start), span.end)
    hi = span.end if hi is None else hi
    hi = max(lo, min(hi, span.end, lo + PAGE))
    return lo, hi


async def strip(
    segment: SegmentTokens, span: Span, lo: int, hi: int, texts: TokenTexts | None
) -> Strip:
    ids = [int(i) for i in segment.ids[lo:hi]]
    shown: list[str] | None = None
    if texts is not None:
        try:
            shown = await texts.texts(ids)
        except DetokenizeFailed:
            shown = None
    marks = {m.position: m for m in segment.marks if lo <= m.position < hi}
    tokens = []
    for offset, token_id in enumerate(ids):
        at = lo + offset
        text = shown[offset] if shown is not None else f"{token_id} "
        tokens.append(
            Token(
                text,
                _css(segment, at, text if shown is not None else None),
                _title(segment, at, token_id),
                marks.get(at),
            )
        )
    earlier = (max(span.context_start, lo - PAGE), lo) if lo > span.context_start else None
    later = (hi, min(span.end, hi + PAGE)) if hi < span.end else None
    return Strip(span, lo, hi, tokens, earlier, later)


def band(logprob: float) -> int:
    """0 (likely) .. 5 (unlikely); 6 when the engine gave no logprob."""
    if math.isnan(logprob):
        return 6
    p = math.exp(logprob)
    return next((i for i, edge in enumerate(_BANDS) if p >= edge), len(_BANDS))


def _css(segment: SegmentTokens, at: int, text: str | None) -> str:
    classes = [f"s l{band(float(segment.logprobs[at]))}" if segment.mask[at] else "c"]
    if segment.lost[at]:
        classes.append("x")
    if text is not None and _SPECIAL.match(text):
        classes.append("sp")
    if text is None:
        classes.append("id")
    return " ".join(classes)


def _title(segment: SegmentTokens, at: int, token_id: int) -> str:
    where = f"#{at} id {token_id}"
    if not segment.mask[at]:
        return f"{where} · not sampled (mask 0)"
    logprob = float(segment.logprobs[at])
    if math.isnan(logprob):
        return f"{where} · sampled, no logprob"
    lost = " · lost by a later break" if segment.lost[at] else ""
    return f"{where} · logprob {logprob:.3f} · p {math.exp(logprob):.3f}{lost}"
