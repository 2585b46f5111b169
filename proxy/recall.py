"""What the engine answered earlier in each rollout, so a harness's history can be restored exactly.

Answers are kept in memory as the engine produced them (bounded, least recently used first out).
After a restart, or once evicted, an answer is rebuilt from the call's recorded response body,
which holds every text, reasoning text and Responses `function_call.arguments` verbatim; tool
arguments the client received as an object (Anthropic `tool_use.input`, Codex custom tool input)
are re-serialized canonically (`json.dumps(..., ensure_ascii=False)`), which is the engine's own
spelling for vLLM, SGLang and the built-in engine, and ids rolltap minted for the client stand in
for the engine's own.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..store import CallDialect, NotFound, Store, StoreError
from .handles import Handle, Handles

log = logging.getLogger("rolltap.proxy")


@dataclass(frozen=True)
class EngineTurn:
    message: dict[str, Any]
    """The assistant message as the engine produced it: role, content, its reasoning field,
    tool_calls (id, type, function name and arguments text)."""


RecordedTurn = Callable[[bytes, int], EngineTurn | None]
"""Rebuilds choice `n` of a recorded client-dialect response body."""


class Recall:
    def __init__(
        self,
        handles: Handles,
        store: Store,
        recorded: Mapping[CallDialect, RecordedTurn],
        max_entries: int = 50_000,
    ) -> None:
        self.handles = handles
        self._store = store
        self._recorded = recorded
        self._max = max_entries
        self._turns: OrderedDict[tuple[str, Handle], EngineTurn] = OrderedDict()
        self._handles: dict[str, set[Handle]] = {}
        """Rollout id -> its handles in _turns, to forget a finished rollout at once."""

    def __len__(self) -> int:
        return len(self._turns)

    def remember(self, rollout_id: str, handle: Handle, turn: EngineTurn) -> None:
        key = (rollout_id, handle)
        self._turns[key] = turn
        self._turns.move_to_end(key)
        self._handles.setdefault(rollout_id, set()).add(handle)
        while len(self._turns) > self._max:
            (old_rollout, old_handle), _ = self._turns.popitem(last=False)
            self._unindex(old_rollout, old_handle)

    def forget(self, rollout_id: str) -> None:
        """Drop a finished rollout's answers (the store still has them)."""
        for handle in self._handles.pop(rollout_id, ()):
            self._turns.pop((rollout_id, handle), None)

    def _unindex(self, rollout_id: str, handle: Handle) -> None:
        handles = self._handles.get(rollout_id)
        if handles is not None:
            handles.discard(handle)
            if not handles:
                del self._handles[rollout_id]

    async def lookup(self, rollout_id: str, wanted: Iterable[Handle]) -> dict[Handle, EngineTurn]:
        """The answers behind valid handles; an answer that cannot be found is left out."""
        found: dict[Handle, EngineTurn] = {}
        for handle in wanted:
            key = (rollout_id, handle)
            turn = self._turns.get(key)
            if turn is None:
                turn = await self._from_store(rollout_id, handle)
                if turn is None:
                    continue
                self.remember(rollout_id, handle, turn)
            else:
                self._turns.move_to_end(key)
            found[handle] = turn
        return found

    async def _from_store(self, rollout_id: str, handle: Handle) -> EngineTurn | None:
        try:
            call = await self._store.call(handle.call_id)
            if call.rollout_id != rollout_id:
                return None
            recorded = self._recorded.get(call.dialect)
            if recorded is None:
                return None
            bodies = await self._store.call_bodies(handle.call_id)
        except NotFound:
            return None
        except StoreError as e:
            log.warning("could not read a recorded answer back: %s", type(e).__name__)
            return None
        if bodies.response is None:
            return None
        return recorded(bodies.response, handle.choice)
