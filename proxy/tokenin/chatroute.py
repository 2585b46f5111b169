"""Token-in through the engine's own chat route, so the engine's parsers read the answer.

`--token-in-route chat`: the call goes to the engine's chat completions as any call does, with
the bridged prompt ids attached where the engine takes a token prompt on that route (vLLM 0.33
and later: `kv_transfer_params.prompt_token_ids`; SGLang: `input_ids`; rolltap's engine: as
vLLM). The engine skips its chat template, samples from those ids and splits the answer with its
own `--tool-call-parser` and `--reasoning-parser`, so rolltap's parser flags are not used. An
engine that does not know the field renders the messages instead, silently: the prompt ids it
reports then differ from the ids sent, which the call records as `engine_rendered` (a break).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..upstream.engines import EngineKind, Prepared, prepare_chat


class ChatIdsRoute:
    """One call's chat request with its token prompt attached (an `EngineCall` route)."""

    reads_text = False
    """The engine answers chat; a continuation after an abort is read as any chat call's."""

    def __init__(self, prompt_ids: list[int]) -> None:
        self.prompt_ids = prompt_ids

    def prepare(self, chat: dict[str, Any], kind: EngineKind) -> Prepared:
        prepared = prepare_chat(chat, kind)
        body = dict(prepared.body)
        if kind is EngineKind.SGLANG:
            body["input_ids"] = self.prompt_ids
        else:
            transfer = body.get("kv_transfer_params")
            kept = transfer if isinstance(transfer, dict) else {}
            body["kv_transfer_params"] = {**kept, "prompt_token_ids": self.prompt_ids}
        return dataclasses.replace(prepared, body=body)

    def whole(self, doc: dict[str, Any], *, resumes: bool = False) -> dict[str, Any]:
        return doc

    def chunk(self, doc: dict[str, Any], *, resumes: bool = False) -> dict[str, Any]:
        return doc

    def used_by(self, engine_prompt: list[int] | None) -> bool:
        """Whether the prompt the engine reports sampling from is the one sent."""
        return engine_prompt is not None and list(engine_prompt) == self.prompt_ids
