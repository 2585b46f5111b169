"""A batch's event log: numbered events a subscriber reads from any point, as they happen.

Event ids start at 1 and never repeat, so a client that reconnects with `Last-Event-ID: n`
gets exactly the events after n. An event holds what is needed to build its message, not the
message: a group's trajectories are read from the store when sent, so the log stays small
whatever the batch's size and a replay shows what the store holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any


class EventKind(enum.StrEnum):
    GROUP = "group"
    """A complete group that was kept: its samples and trajectories."""
    DROPPED = "dropped"
    """A complete group that was not kept (uninformative, stale), with why and its rewards."""
    DONE = "done"
    """The batch ended (finished, target reached, cancelled or failed); the stream closes."""


@dataclass(frozen=True)
class Event:
    id: int
    kind: EventKind
    data: dict[str, Any]
    """The message (DROPPED, DONE) or what to build it from (GROUP: the group's record)."""


@dataclass
class EventLog:
    events: list[Event] = field(default_factory=list)
    closed: bool = False
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def append(self, kind: EventKind, data: dict[str, Any]) -> Event:
        async with self._changed:
            event = Event(len(self.events) + 1, kind, data)
            self.events.append(event)
            if kind is EventKind.DONE:
                self.closed = True
            self._changed.notify_all()
            return event

    async def follow(self, after: int = 0, heartbeat: float = 15.0) -> AsyncIterator[Event | None]:
        """Events with id > `after`, waiting for new ones until DONE; None every `heartbeat`
        seconds without one (for keep-alive comments)."""
        position = max(0, after)
        while True:
            async with self._changed:
                if position >= len(self.events) and not self.closed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), heartbeat)
                pending = self.events[position:]
            if not pending:
                if self.closed:
                    return
                yield None
                continue
            for event in pending:
                position = event.id
                yield event
                if event.kind is EventKind.DONE:
                    return
