"""Word-level diffs of two texts, for drift breaks and edited history."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from ..analysis.turns import ConversationTurn

_WORDS = re.compile(r"\s+|\w+|[^\w\s]")
LIMIT = 20_000
"""Characters per side compared word by word; longer texts are compared at their ends only."""


@dataclass(frozen=True)
class Piece:
    op: str
    """= kept, - removed, + added."""
    text: str


def word_diff(old: str, new: str) -> list[Piece]:
    a, b = _WORDS.findall(_clip(old)), _WORDS.findall(_clip(new))
    pieces: list[Piece] = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            pieces.append(Piece("=", "".join(a[i1:i2])))
            continue
        if i2 > i1:
            pieces.append(Piece("-", "".join(a[i1:i2])))
        if j2 > j1:
            pieces.append(Piece("+", "".join(b[j1:j2])))
    return pieces


def turn_text(turn: ConversationTurn | None) -> str:
    """A turn as one text, the way a diff of two of them reads best."""
    if turn is None:
        return ""
    parts = [f"[{turn.role}]"]
    if turn.reasoning:
        parts.append(f"<reasoning>{turn.reasoning}</reasoning>")
    if turn.text:
        parts.append(turn.text)
    parts += [f"{c.name}({c.arguments})" for c in turn.tool_calls]
    return "\n".join(parts)


def _clip(text: str) -> str:
    if len(text) <= LIMIT:
        return text
    half = LIMIT // 2
    return f"{text[:half]} … {text[-half:]}"
