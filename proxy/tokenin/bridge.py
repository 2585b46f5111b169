"""The bridge: the ids that follow an answer's stop token up to the next assistant header.

The next prompt of a conversation is its previous prompt, the ids the engine sampled, then the
bridge. The bridge is rendered with the engine's own chat template, on a fixed dummy
conversation rather than the real history (whose re-rendering is exactly what token-in
avoids):

    base   = render([user ".", assistant "."])                     (no generation prompt)
    full   = render([user ".", assistant "."] + new messages)      (with the generation prompt)
    glue   = the ids after the dummy answer's text: what the template writes after a turn,
             found as the common end of `base` and the same with another dummy answer
    bridge = full[from just after the answer's stop token inside glue:]

so what the template puts after the stop token (ChatML's newline after <|im_end|>) is part of
the bridge. A template that does not render the new messages as an extension of `base` gives no
bridge: the call falls back with a reason code.

An answer that did not end its turn (cut at its token limit, or stopped by a stop string, so
its last id is no token the template ends turns with) is closed by rolltap: `end_of_turn` is the
first id of `glue`, the token the template ends an assistant turn with (ChatML's <|im_end|>),
and the bridge follows it, so the next prompt is the previous prompt, the sampled ids, the end
of turn and the bridge: what the template writes after the answer's text. A cut answer counts
as ended only when its last id is that token (SGLang reports `length` for an answer whose last
allowed id was its stop token); a stopped one when its last id is any of `glue`'s.

`Template` is the seam: `LocalTemplate` renders in process (the engine's tokenizer and template
files), `RemoteTemplate` asks the engine's /tokenize with messages. Base renders are cached per
tools and template options.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson

from .lineage import NO_STOP_TOKEN, TEMPLATE_MISMATCH, TRUNCATED

_USER = {"role": "user", "content": "."}
_DOT = [_USER, {"role": "assistant", "content": "."}]
_COMMA = [_USER, {"role": "assistant", "content": ","}]


class TemplateFailed(Exception):
    """The template could not render the messages (the engine refused, or is unreachable)."""


class Template(Protocol):
    async def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        options: dict[str, Any] | None,
        *,
        add_generation_prompt: bool,
    ) -> list[int]:
        """The ids the engine's chat template makes of `messages`; TemplateFailed if none."""
        ...


@dataclass(frozen=True)
class _Base:
    ids: list[int]
    glue: list[int]


class Bridges:
    """Computes bridges through one `Template`, caching the dummy renders."""

    def __init__(self, template: Template, cache: int = 256) -> None:
        self.template = template
        self._bases: OrderedDict[bytes, _Base] = OrderedDict()
        self._cache = cache

    async def end_of_turn(
        self,
        last_id: int,
        cut: bool,
        tools: list[dict[str, Any]] | None,
        options: dict[str, Any] | None,
    ) -> list[int] | str:
        """The ids rolltap adds after an answer (`last_id`: its last sampled id; `cut`: it ended
        at its token limit) to end its turn: none when the answer ended it, else the template's
        end-of-turn token; a reason code when the template writes none after an answer."""
        glue = (await self._base(tools, options)).glue
        if not glue:
            return TRUNCATED if cut else NO_STOP_TOKEN
        if last_id == glue[0] or (not cut and last_id in glue):
            return []
        return glue[:1]

    async def bridge(
        self,
        stop_id: int,
        tail: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        options: dict[str, Any] | None,
    ) -> list[int] | str:
        """The ids after `stop_id` (an answer's last sampled id) up to the next assistant
        header, with `tail` in between; a reason code when the template gives none."""
        base = await self._base(tools, options)
        if stop_id not in base.glue:
            return NO_STOP_TOKEN
        full = await self.template.render(
            [*_DOT, *tail], tools, options, add_generation_prompt=True
        )
        if full[: len(base.ids)] != base.ids:
            return TEMPLATE_MISMATCH
        start = len(base.ids) - len(base.glue) + base.glue.index(stop_id) + 1
        return full[start:]

    async def _base(
        self, tools: list[dict[str, Any]] | None, options: dict[str, Any] | None
    ) -> _Base:
        key = orjson.dumps([tools, options], option=orjson.OPT_SORT_KEYS)
        found = self._bases.get(key)
        if found is not None:
            self._bases.move_to_end(key)
            return found
        dot = await self.template.render(_DOT, tools, options, add_generation_prompt=False)
        comma = await self.template.render(_COMMA, tools, options, add_generation_prompt=False)
        same = 0
        while same < min(len(dot), len(comma)) and dot[-1 - same] == comma[-1 - same]:
            same += 1
        base = _Base(dot, dot[len(dot) - same :])
        self._bases[key] = base
        if len(self._bases) > self._cache:
            self._bases.popitem(last=False)
        return base


class LocalTemplate:
    """The engine's tokenizer and chat template, in this process (rolltap's engine renders with
    the same code, chatformat/template.py, so its prompts and these bridges agree)."""

    def __init__(self, renderer: Any) -> None:
        self._renderer = renderer

    @classmethod
    def load(cls, tokenizer: str, chat_template: str | None) -> LocalTemplate:
        """From a model or tokenizer directory or a GGUF file (transformers, the engine extra)."""
        from transformers import AutoTokenizer

        from ...chatformat.template import ChatRenderer

        path = Path(tokenizer)
        if path.is_file():
            loaded = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        else:
            loaded = AutoTokenizer.from_pretrained(tokenizer)
        template = None if chat_template is None else Path(chat_template).read_text()
        return cls(ChatRenderer(loaded, template))

    async def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        options: dict[str, Any] | None,
        *,
        add_generation_prompt: bool,
    ) -> list[int]:
        from ...engine.errors import RequestError

        try:
            rendered = self._renderer.render(
                messages,
                tools,
                add_generation_prompt=add_generation_prompt,
                template_kwargs=options,
            )
        except RequestError as e:
            raise TemplateFailed(str(e)) from e
        return list(rendered.token_ids)


class RemoteTemplate:
    """The engine's own /tokenize with messages (vLLM, SGLang and rolltap's engine take them)."""

    def __init__(
        self, session: aiohttp.ClientSession, url: str, model: str | None, path: str = "/tokenize"
    ) -> None:
        self._session = session
        self._url = url.rstrip("/") + path
        self._model = model

    async def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        options: dict[str, Any] | None,
        *,
        add_generation_prompt: bool,
    ) -> list[int]:
        body: dict[str, Any] = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
        }
        if self._model is not None:
            body["model"] = self._model
        if tools:
            body["tools"] = tools
        if options:
            body["chat_template_kwargs"] = options
        try:
            async with self._session.post(self._url, data=orjson.dumps(body)) as response:
                raw = await response.read()
                if response.status != 200:
                    raise TemplateFailed(
                        f"HTTP {response.status}: {raw[:300].decode(errors='replace')}"
                    )
        except (aiohttp.ClientError, TimeoutError) as e:
            raise TemplateFailed(f"{type(e).__name__}: {e}") from e
        try:
            doc = orjson.loads(raw)
            tokens = doc["tokens"]
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise TypeError("tokens is not a list of ids")
        except (ValueError, KeyError, TypeError) as e:
            raise TemplateFailed(f"unreadable /tokenize answer: {e}") from e
        return tokens
