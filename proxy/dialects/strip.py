"""Take rolltap's extras out of an engine's JSON before the client sees it.

Token-id arrays are cut out of the raw bytes, so everything else stays byte for byte what the
engine sent. An empty `tool_calls` list is cut the same way (rolltap's built-in engine sends one
with every whole answer, some vLLM versions with stream deltas): OpenAI leaves the member out
of an answer without calls (its SDK reads `tool_calls` as None), as vLLM 0.33 does.

Logprobs the client did not ask for must become `null`; that needs the document
re-serialized, which orjson does in C with the engine's compact layout (same keys, order and
values; only float spelling could differ, and the floats are the logprobs being removed).

The byte edits find members by their key (any spacing around the colon) wherever they appear
as keys: engines put these keys only where rolltap asked for them (and `tool_calls` only in a
message or delta). tests/proxy/test_strip_fuzz.py holds both paths to a reference that
parses, edits and re-serializes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from ..upstream.engines import Extras

ROOT_ID_KEYS = (b"prompt_token_ids",)
CHOICE_ID_KEYS = (b"token_ids", b"prompt_token_ids", b"response_token_ids")
TOOL_PARSE = b'"tool_parse"'
"""rolltap's own: a choice's tool-call parse outcome (token-in answers, the built-in engine's),
recorded with the call and never shown to the client. Inside a JSON string its quotes would be
escaped, so these bytes are always the key."""


WEIGHT_VERSIONS = b'"weight_versions"'
"""vLLM's per-choice spans, asked for by rolltap (a stream carries them on its last chunk)."""
TOOL_CALLS = b'"tool_calls"'
"""A message's (or delta's) calls: cut when the list is empty, as OpenAI sends none."""


def strip(raw: bytes, doc: dict[str, Any], extras: Extras) -> bytes:
    """The client's view of a whole response body."""
    if (
        extras.logprobs
        or extras.meta_info
        or extras.routed_experts
        or TOOL_PARSE in raw
        or (extras.weight_versions and WEIGHT_VERSIONS in raw)
    ):
        return orjson.dumps(_stripped_doc(doc, extras))
    return _cut_no_calls(_cut_ids(raw, extras))


def strip_chunk(raw: bytes, doc: dict[str, Any], extras: Extras) -> bytes:
    """The client's view of one stream chunk: small, so even logprobs are cut from the bytes."""
    if (
        extras.meta_info
        or (extras.routed_experts and b'"sglext"' in raw)
        or TOOL_PARSE in raw
        or (extras.weight_versions and WEIGHT_VERSIONS in raw)
    ):
        return orjson.dumps(_stripped_doc(doc, extras))
    if not extras.routed_experts and orjson.dumps(doc) == raw:
        # The engine wrote it as orjson does (vLLM's compact layout): the bytes edited below
        # would be the stripped document re-serialized, which orjson writes in C, where the
        # edits scan the chunk in Python (several times the CPU, 200 times a stream).
        return orjson.dumps(_stripped_doc(doc, extras))
    if extras.logprobs:
        raw = null_values(raw, b"logprobs")
    return _cut_no_calls(_cut_ids(raw, extras))


def _cut_ids(raw: bytes, extras: Extras) -> bytes:
    if extras.token_ids:
        for key in ROOT_ID_KEYS + CHOICE_ID_KEYS:
            if key in raw:
                raw = cut_int_arrays(raw, key)
    return raw


def _cut_no_calls(raw: bytes) -> bytes:
    return cut_empty_arrays(raw, b"tool_calls") if TOOL_CALLS in raw else raw


_SCAN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]]')
_SPACE = frozenset(b" \t\n\r")
_COLON, _COMMA = ord(":"), ord(",")


def _members(raw: bytes, quoted: bytes, start: int = 0) -> tuple[int, int] | None:
    """The next member whose key is `quoted` from `start`: where its key and its value begin.

    The key counts only when its opening quote is not escaped and a colon follows (spaces
    allowed): inside a JSON string every quote is escaped, so such an occurrence is a real key.
    Bytes are compared as ints: this runs for every stream chunk.
    """
    at = raw.find(quoted, start)
    end = len(raw)
    while at != -1:
        i = at + len(quoted)
        while i < end and raw[i] in _SPACE:
            i += 1
        if i < end and raw[i] == _COLON and not _escaped(raw, at):
            i += 1
            while i < end and raw[i] in _SPACE:
                i += 1
            return at, i
        at = raw.find(quoted, at + 1)
    return None


def null_values(raw: bytes, key: bytes) -> bytes:
    """Replace the value of every member `"key": {...}` or `[...]` with null."""
    quoted = b'"' + key + b'"'
    found = _members(raw, quoted)
    while found is not None:
        _, value = found
        if raw[value : value + 1] in (b"{", b"["):
            depth = 0
            for match in _SCAN.finditer(raw, value):
                token = match.group()
                if token in (b"{", b"["):
                    depth += 1
                elif token in (b"}", b"]"):
                    depth -= 1
                    if depth == 0:
                        raw = raw[:value] + b"null" + raw[match.end() :]
                        break
            else:
                raise ValueError("unterminated JSON value")
        found = _members(raw, quoted, value)
    return raw


def _stripped_doc(doc: dict[str, Any], extras: Extras) -> dict[str, Any]:
    out = dict(doc)
    if extras.token_ids:
        for key in ROOT_ID_KEYS:
            out.pop(key.decode(), None)
    if extras.routed_experts:
        out.pop("sglext", None)
    choices = out.get("choices")
    if isinstance(choices, list):
        cleaned = []
        for choice in choices:
            if not isinstance(choice, dict):
                cleaned.append(choice)
                continue
            c = dict(choice)
            if extras.token_ids:
                for key in CHOICE_ID_KEYS:
                    c.pop(key.decode(), None)
            if extras.logprobs and "logprobs" in c:
                c["logprobs"] = None
            if extras.meta_info:
                c.pop("meta_info", None)
            if extras.routed_experts:
                c.pop("routed_experts", None)
            if extras.weight_versions:
                c.pop("weight_versions", None)
            c.pop("tool_parse", None)
            for part in ("message", "delta"):
                said = c.get(part)
                if isinstance(said, dict) and said.get("tool_calls") == []:
                    c[part] = {k: v for k, v in said.items() if k != "tool_calls"}
            cleaned.append(c)
        out["choices"] = cleaned
    return out


def cut_int_arrays(raw: bytes, key: bytes) -> bytes:
    """Remove every member `"key": [ints]` (or `"key": null`) from a JSON text."""
    return _cut_members(raw, b'"' + key + b'"', _ints_or_null_end)


def cut_empty_arrays(raw: bytes, key: bytes) -> bytes:
    """Remove every member `"key": []` (any spacing inside) from a JSON text; a list with
    anything in it, or null, stays."""
    return _cut_members(raw, b'"' + key + b'"', _empty_array_end)


def _ints_or_null_end(raw: bytes, value: int) -> int | None:
    if raw.startswith(b"[", value):
        return raw.index(b"]", value) + 1
    if raw.startswith(b"null", value):
        return value + 4
    return None


def _empty_array_end(raw: bytes, value: int) -> int | None:
    if not raw.startswith(b"[", value):
        return None
    i = value + 1
    while i < len(raw) and raw[i] in _SPACE:
        i += 1
    return i + 1 if raw.startswith(b"]", i) else None


def _cut_members(raw: bytes, quoted: bytes, value_end: Callable[[bytes, int], int | None]) -> bytes:
    """Remove every member keyed `quoted` whose value `value_end` takes (it tells where the
    value that begins at an offset ends, or None to keep the member), with the comma that
    separates it from its neighbours."""
    found = _members(raw, quoted)
    while found is not None:
        start, value = found
        end = value_end(raw, value)
        if end is None:
            found = _members(raw, quoted, value)
            continue
        before = start - 1
        while before >= 0 and raw[before] in _SPACE:
            before -= 1
        if before >= 0 and raw[before] == _COMMA:
            raw = raw[:before] + raw[end:]
            found = _members(raw, quoted, before)
        else:
            after = end
            while after < len(raw) and raw[after] in _SPACE:
                after += 1
            if after < len(raw) and raw[after] == _COMMA:
                end = after + 1
            raw = raw[:start] + raw[end:]
            found = _members(raw, quoted, start)
    return raw


def _escaped(raw: bytes, quote: int) -> bool:
    backslashes = 0
    i = quote - 1
    while i >= 0 and raw[i] == 0x5C:
        backslashes += 1
        i -= 1
    return backslashes % 2 == 1
