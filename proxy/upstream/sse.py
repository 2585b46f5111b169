"""Server-sent events: split a byte stream into events, read an event's data."""

from __future__ import annotations

DONE = b"[DONE]"


class EventSplitter:
    """Feed bytes as they arrive; get back whole events (each ending with its blank line)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        if b"\r" in self._buffer:
            self._buffer = self._buffer.replace(b"\r\n", b"\n")
        events: list[bytes] = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end == -1:
                return events
            events.append(self._buffer[: end + 2])
            self._buffer = self._buffer[end + 2 :]

    @property
    def leftover(self) -> bytes:
        return self._buffer


def event_data(event: bytes) -> bytes | None:
    """The event's data (several data lines joined by newlines), or None for a comment-only one."""
    parts = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(parts) if parts else None


def event_name(event: bytes) -> bytes | None:
    for line in event.split(b"\n"):
        if line.startswith(b"event:"):
            return line[6:].strip()
    return None


def frame(data: bytes, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + data + b"\n\n"
