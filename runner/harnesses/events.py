"""Reads the JSON-lines event streams that harnesses print (Codex, Claude Code, Qwen Code, ...)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def json_events(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects among `text`'s lines; banners and other non-JSON lines are skipped."""
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


def last_event(text: str, kind: str, key: str = "type") -> dict[str, Any] | None:
    """The last event whose `key` field equals `kind`."""
    found = None
    for event in json_events(text):
        if event.get(key) == kind:
            found = event
    return found
