"""The page templates (jinja2, autoescaped: everything shown came from a model or a harness)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web

from ..analysis.turns import ConversationTurn
from .diff import Piece, turn_text, word_diff

HERE = Path(__file__).parent


class Templates:
    def __init__(self) -> None:
        self._env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self._env.filters.update(
            when=when,
            reward=reward,
            share=share,
            num=num,
            seconds=seconds,
            ms=ms,
            tok=token_text,
            tok_inline=lambda text: text.replace("\n", "↵"),
            runs=runs,
            pretty_json=pretty_json,
            compact_json=compact_json,
        )
        self._env.globals["turn_diff"] = turn_diff

    def add_global(self, name: str, value: Any) -> None:
        self._env.globals[name] = value

    def render(self, name: str, **context: Any) -> str:
        return self._env.get_template(name).render(**context)

    def page(self, name: str, *, status: int = 200, **context: Any) -> web.Response:
        return web.Response(
            text=self.render(name, **context), status=status, content_type="text/html"
        )


def when(t: datetime | None) -> str:
    return "-" if t is None else t.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def reward(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.3g}"


def share(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1%}"


def num(value: int | float) -> str:
    return f"{value:,}"


def seconds(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return "-"
    s = (end - start).total_seconds()
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def ms(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return "-"
    return f"{(end - start).total_seconds() * 1000:,.0f}"


def token_text(text: str) -> str:
    """A token as a strip shows it: line breaks stay breaks and are marked, so they are seen."""
    return text.replace("\n", "↵\n")


def pretty_json(text: str) -> str:
    """Tool-call arguments indented when they are JSON, as sent otherwise."""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def compact_json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def turn_diff(old: ConversationTurn | None, new: ConversationTurn | None) -> list[Piece]:
    return word_diff(turn_text(old), turn_text(new))


def runs(call_ids: Sequence[str], seqs: Mapping[str, int]) -> list[tuple[int, int]]:
    """Calls by seq, in runs: 1,2,3,5 as (1, 3), (5, 5)."""
    found: list[tuple[int, int]] = []
    for s in (seqs[c] for c in call_ids):
        if found and s == found[-1][1] + 1:
            found[-1] = (found[-1][0], s)
        else:
            found.append((s, s))
    return found
