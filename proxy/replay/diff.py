"""How a replayed request differs from the recorded one, message by message.

Both bodies are normalized first (normalize.py). The conversation is the dialect's message list
(Chat `messages`; Responses `instructions` then `input` items; Messages `system` then
`messages`); everything else is a parameter, compared as a whole per field. Messages are lined
up with difflib's matcher, so a message inserted in the middle is one `added`, not a cascade of
changes; each changed message carries a unified diff of its text (recorded `-`, replayed `+`).
"""

from __future__ import annotations

import difflib
from typing import Any

import orjson

from ...audit.replay import Divergence, MessageChange
from ...store import CallDialect

_MAX_LINES = 200
"""Diff lines kept per message: the report stays readable and bounded."""
_MAX_LINE = 400


def conversation(body: Any, dialect: CallDialect) -> tuple[list[Any], dict[str, Any]]:
    """(the messages, the other fields) of a request body in its dialect."""
    if not isinstance(body, dict):
        return [body], {}
    params = dict(body)
    messages: list[Any] = []
    if dialect is CallDialect.RESPONSES:
        instructions = params.pop("instructions", None)
        if instructions is not None:
            messages.append({"role": "instructions", "content": instructions})
        items = params.pop("input", None)
        messages += [{"role": "user", "content": items}] if isinstance(items, str) else items or []
    elif dialect is CallDialect.MESSAGES:
        system = params.pop("system", None)
        if system is not None:
            messages.append({"role": "system", "content": system})
        messages += params.pop("messages", None) or []
    else:
        messages += params.pop("messages", None) or []
    return messages, params


def divergence(recorded: Any, replayed: Any, dialect: CallDialect) -> Divergence | None:
    """None when the two (normalized) bodies are equal."""
    if recorded == replayed:
        return None
    old, old_params = conversation(recorded, dialect)
    new, new_params = conversation(replayed, dialect)
    params = sorted(
        k for k in old_params.keys() | new_params.keys() if old_params.get(k) != new_params.get(k)
    )
    changes = _changes(old, new)
    return Divergence(params=params, messages=changes, summary=_summary(params, changes))


def _changes(old: list[Any], new: list[Any]) -> list[MessageChange]:
    keys_old = [_canonical(m) for m in old]
    keys_new = [_canonical(m) for m in new]
    matcher = difflib.SequenceMatcher(None, keys_old, keys_new, autojunk=False)
    changes: list[MessageChange] = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        paired = min(i2 - i1, j2 - j1) if op == "replace" else 0
        for k in range(paired):
            a, b = old[i1 + k], new[j1 + k]
            diff = _unified(_lines(a), _lines(b))
            changes.append(MessageChange("changed", j1 + k, _role(b), diff))
        for i in range(i1 + paired, i2):
            diff = [f"-{line}" for line in _lines(old[i])][:_MAX_LINES]
            changes.append(MessageChange("removed", i, _role(old[i]), diff))
        for j in range(j1 + paired, j2):
            diff = [f"+{line}" for line in _lines(new[j])][:_MAX_LINES]
            changes.append(MessageChange("added", j, _role(new[j]), diff))
    return sorted(changes, key=lambda c: c.index)


def _summary(params: list[str], changes: list[MessageChange]) -> str:
    if changes:
        first = changes[0]
        minus = next((d for d in first.diff if d.startswith("-")), None)
        plus = next((d for d in first.diff if d.startswith("+")), None)
        detail = " / ".join(_clip(d.strip(), 80) for d in (minus, plus) if d)
        where = f"message {first.index} ({first.role}) {first.kind}"
        return f"{where}: {detail}" if detail else where
    return "request fields differ: " + ", ".join(params)


def _unified(a: list[str], b: list[str]) -> list[str]:
    diff = difflib.unified_diff(a, b, lineterm="", n=1)
    return [_clip(d, _MAX_LINE) for d in diff if not d.startswith(("---", "+++"))][:_MAX_LINES]


def _lines(message: Any) -> list[str]:
    """A message as text lines: its role, then each field, strings split at newlines."""
    if not isinstance(message, dict):
        return _value_lines("", message)
    lines = [f"role: {_role(message)}"]
    for key, value in message.items():
        if key != "role":
            lines += _value_lines(key, value)
    return lines


def _value_lines(label: str, value: Any) -> list[str]:
    if isinstance(value, str):
        first, *rest = value.split("\n")
        return [f"{label}: {first}", *(f"  {line}" for line in rest)]
    if isinstance(value, list):
        lines: list[str] = []
        for i, part in enumerate(value):
            lines += _value_lines(f"{label}[{i}]", part)
        return lines
    if isinstance(value, dict) and value:
        lines = []
        for key, v in value.items():
            lines += _value_lines(f"{label}.{key}" if label else str(key), v)
        return lines
    return [f"{label}: {orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()}"]


def _role(message: Any) -> str:
    if isinstance(message, dict):
        return str(message.get("role") or message.get("type") or "item")
    return "item"


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
