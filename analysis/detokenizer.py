"""Detokenizers for drift classification: a local HF tokenizer, or an engine's /detokenize.

Both implement `rolltap.analysis.drift.Detokenizer`. Neither reaches the network for weights or
vocabularies: the HF one loads only local files (a tokenizer folder or a GGUF file).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from ..store.packing import IdArray
from .drift import DetokenizeFailed


class HFDetokenizer:
    """A transformers tokenizer; special tokens are kept, spaces are not cleaned up."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    @classmethod
    def from_path(cls, path: str | Path) -> HFDetokenizer:
        """Load from a tokenizer folder, or from a .gguf file (its embedded vocabulary)."""
        # Imported here: transformers takes seconds to import and most callers never need it.
        from transformers import AutoTokenizer

        path = Path(path).expanduser()
        try:
            if path.suffix == ".gguf":
                tokenizer = AutoTokenizer.from_pretrained(
                    path.parent, gguf_file=path.name, local_files_only=True
                )
            else:
                tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as e:
            raise DetokenizeFailed(f"cannot load a tokenizer from {path}: {e}") from e
        return cls(tokenizer)

    async def detokenize(self, sequences: Sequence[IdArray]) -> list[str]:
        return await asyncio.to_thread(self._decode, sequences)

    def _decode(self, sequences: Sequence[IdArray]) -> list[str]:
        return [
            self._tokenizer.decode(
                [int(i) for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
            for ids in sequences
        ]


class EngineDetokenizer:
    """POST {base_url}/detokenize {"model", "tokens"} -> {"prompt"} (vLLM's shape)."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        session: aiohttp.ClientSession | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self._url = base_url.rstrip("/") + "/detokenize"
        self._model = model
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def detokenize(self, sequences: Sequence[IdArray]) -> list[str]:
        if self._session is not None:
            return await self._all(self._session, sequences)
        async with aiohttp.ClientSession(timeout=self._timeout) as session:
            return await self._all(session, sequences)

    async def _all(self, session: aiohttp.ClientSession, sequences: Sequence[IdArray]) -> list[str]:
        return [await self._one(session, ids) for ids in sequences]

    async def _one(self, session: aiohttp.ClientSession, ids: IdArray) -> str:
        body: dict[str, Any] = {"tokens": [int(i) for i in ids]}
        if self._model is not None:
            body["model"] = self._model
        try:
            async with session.post(self._url, json=body, timeout=self._timeout) as resp:
                if resp.status != 200:
                    raise DetokenizeFailed(f"{self._url} answered HTTP {resp.status}")
                data = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise DetokenizeFailed(f"{self._url}: {e!r}") from e
        text = data.get("prompt") if isinstance(data, dict) else None
        if not isinstance(text, str):
            raise DetokenizeFailed(f"{self._url} answered without a 'prompt' string")
        return text
