"""The served engine: model, batcher and chat renderer, with an async view of generation."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..chatformat.errors import Unrenderable
from ..chatformat.template import ChatRenderer, RenderedPrompt
from .batcher import Batcher
from .errors import BadRequest, EngineError
from .generation import Aborted, Event, Failure, GenerationRequest, RowEvent
from .model import LoadedModel


class GenerationFailed(EngineError):
    """The batcher gave up on a request (a forward pass failed, or it shut down)."""


@dataclass(frozen=True)
class OutputLimits:
    """Server settings bounding how many tokens a request generates; None is vLLM's behaviour."""

    default_max_tokens: int | None = None
    """For a request that sets no max_tokens; None: whatever the context leaves."""
    max_tokens_cap: int | None = None
    """A request asking for more gets at most this many (and finish_reason "length")."""


@dataclass
class Engine:
    lm: LoadedModel
    batcher: Batcher
    renderer: ChatRenderer
    reasoning_parser: bool
    limits: OutputLimits = field(default_factory=OutputLimits)

    def __post_init__(self) -> None:
        tokenizer = self.lm.tokenizer
        # One id's text is asked for at every logprob position; the vocabulary is small.
        self.token_text = lru_cache(maxsize=1 << 16)(
            lambda token_id: str(tokenizer.decode([token_id], skip_special_tokens=False))
        )

    @property
    def name(self) -> str:
        return self.lm.name

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        continue_final_message: bool,
        template_kwargs: dict[str, Any] | None,
    ) -> RenderedPrompt:
        """The chat template's prompt for these messages; what it refuses is the client's
        400 (the chat formats know nothing of HTTP)."""
        try:
            return self.renderer.render(
                messages,
                tools,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                template_kwargs=template_kwargs,
            )
        except Unrenderable as e:
            raise BadRequest(e.message, e.param) from e

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.lm.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return str(self.lm.tokenizer.decode(ids, skip_special_tokens=False))

    def check_ids(self, ids: list[int], param: str) -> None:
        vocab = len(self.lm.tokenizer)
        bad = [i for i in ids if i >= vocab]
        if bad:
            raise BadRequest(f"token id {bad[0]} is out of vocabulary (size {vocab})", param)

    def max_tokens(self, prompt_len: int, asked: int | None) -> int:
        """vLLM's rule: the prompt must leave room, and max_tokens defaults to what is left.

        The server's limits come first: a request without max_tokens gets the default, and one
        asking for more than the cap is clamped to the cap and to what the context leaves (it
        asked for more than either, so it ends with "length" rather than an error).
        """
        limit = self.lm.max_model_len
        if prompt_len >= limit:
            raise BadRequest(
                f"This model's maximum context length is {limit} tokens. However, your request "
                f"has {prompt_len} input tokens. Please reduce the length of the input messages."
            )
        room = limit - prompt_len
        cap = self.limits.max_tokens_cap
        if asked is None:
            asked = self.limits.default_max_tokens or room
            return min(asked, room, cap or room)
        if cap is not None and asked > cap:
            return min(cap, room)
        if prompt_len + asked > limit:
            raise BadRequest(
                f"'max_tokens' or 'max_completion_tokens' is too large: {asked}. This model's "
                f"maximum context length is {limit} tokens and your request has {prompt_len} "
                f"input tokens ({asked} > {limit} - {prompt_len}).",
                "max_tokens",
            )
        return asked

    async def generate(
        self, requests: list[GenerationRequest]
    ) -> AsyncGenerator[tuple[int, RowEvent], None]:
        """Run requests together; yields (request position, event) as tokens are sampled, and
        an `Aborted` event for a choice ended early by a weight update.

        Closing the iterator early (a client went away) cancels whatever is still running.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

        def sink_for(position: int) -> Any:
            def sink(event: Event) -> None:
                # Runs on the scheduler thread; a closed loop means nobody is listening anymore.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(queue.put_nowait, (position, event))

            return sink

        tickets = [self.batcher.submit(r, sink_for(i)) for i, r in enumerate(requests)]
        open_rows = [r.n for r in requests]
        try:
            while any(open_rows):
                position, event = await queue.get()
                if isinstance(event, Failure):
                    open_rows[position] = 0
                    raise GenerationFailed(event.message)
                if isinstance(event, Aborted) or event.finish_reason is not None:
                    open_rows[position] -= 1
                yield position, event
        finally:
            for ticket, rows in zip(tickets, open_rows, strict=True):
                if rows:
                    self.batcher.cancel(ticket)
