"""Take rolltap's extras out of an engine's JSON before the client sees it.

Token-id arrays are cut out of the raw bytes, so everything else stays byte for byte what the
engine sent. Logprobs the client did not ask for must become `null`; that needs the document
re-serialized, which orjson does in C with the engine's compact layout (same keys, order and
values; only float spelling could differ, and the floats are the logprobs being removed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

ROOT_ID_KEYS = (b"prompt_token_ids",)
CHOICE_ID_KEYS = (b"token_ids", b"prompt_token_ids", b"response_token_ids")


@dataclass(frozen=True)
class Extras:
    """What rolltap added to the engine request that the client did not ask for."""

    token_ids: bool = True
    logprobs: bool = True
    meta_info: bool = False
    """SGLang's per-choice meta_info (asked for its ids)."""


def strip(raw: bytes, doc: dict[str, Any], extras: Extras) -> bytes:
    """The client's view of a whole response body."""
    if extras.logprobs or extras.meta_info:
        return orjson.dumps(_stripped_doc(doc, extras))
    return _cut_ids(raw, extras)


def strip_chunk(raw: bytes, doc: dict[str, Any], extras: Extras) -> bytes:
    """The client's view of one stream chunk: small, so even logprobs are cut from the bytes."""
    if extras.meta_info:
        return orjson.dumps(_stripped_doc(doc, extras))
    if extras.logprobs:
        raw = null_values(raw, b"logprobs")
    return _cut_ids(raw, extras)


def _cut_ids(raw: bytes, extras: Extras) -> bytes:
    if extras.token_ids:
        for key in ROOT_ID_KEYS + CHOICE_ID_KEYS:
            if key in raw:
                raw = cut_int_arrays(raw, key)
    return raw


_SCAN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]]')


def null_values(raw: bytes, key: bytes) -> bytes:
    """Replace the value of every member `"key": {...}` or `[...]` with null."""
    needle = b'"' + key + b'":'
    start = raw.find(needle)
    while start != -1:
        value = start + len(needle)
        while raw[value : value + 1] in (b" ", b"\t", b"\n", b"\r"):
            value += 1
        if _escaped(raw, start) or raw[value : value + 1] not in (b"{", b"["):
            start = raw.find(needle, value)
            continue
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
        start = raw.find(needle, value + 4)
    return raw


def _stripped_doc(doc: dict[str, Any], extras: Extras) -> dict[str, Any]:
    out = dict(doc)
    if extras.token_ids:
        for key in ROOT_ID_KEYS:
            out.pop(key.decode(), None)
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
            cleaned.append(c)
        out["choices"] = cleaned
    return out


def cut_int_arrays(raw: bytes, key: bytes) -> bytes:
    """Remove every member `"key": [ints]` (or `"key": null`) from a JSON text.

    An occurrence counts only when its opening quote is not escaped: inside a JSON string every
    quote is escaped, so such an occurrence is a real key.
    """
    needle = b'"' + key + b'":'
    start = raw.find(needle)
    while start != -1:
        if _escaped(raw, start):
            start = raw.find(needle, start + 1)
            continue
        value = start + len(needle)
        while raw[value : value + 1] in (b" ", b"\t", b"\n", b"\r"):
            value += 1
        if raw.startswith(b"[", value):
            end = raw.index(b"]", value) + 1
        elif raw.startswith(b"null", value):
            end = value + 4
        else:
            start = raw.find(needle, value)
            continue
        before = start - 1
        while before >= 0 and raw[before : before + 1] in (b" ", b"\n", b"\t", b"\r"):
            before -= 1
        if before >= 0 and raw[before : before + 1] == b",":
            raw = raw[:before] + raw[end:]
            start = raw.find(needle, before)
        else:
            after = end
            while raw[after : after + 1] in (b" ", b"\n", b"\t", b"\r"):
                after += 1
            if raw[after : after + 1] == b",":
                end = after + 1
            raw = raw[:start] + raw[end:]
            start = raw.find(needle, start)
    return raw


def _escaped(raw: bytes, quote: int) -> bool:
    backslashes = 0
    i = quote - 1
    while i >= 0 and raw[i] == 0x5C:
        backslashes += 1
        i -= 1
    return backslashes % 2 == 1
