"""Which rollout a request belongs to, and whether that rollout may still make calls.

The rollout key comes from the base URL (`/r/<key>/v1/...`) or, equally, the credential
(`Authorization: Bearer <key>` or `x-api-key: <key>`). Keys map to rollouts through the store
(which holds only hashes); states are cached and re-read every few seconds so a rollout the
runner finished elsewhere stops taking calls.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from aiohttp import web

from rolltap.proxy.errors import Forbidden, Unauthorized
from rolltap.store import NewRollout, RolloutStatus, RolloutView, Store
from rolltap.store.ids import hash_key
from rolltap.store.store import FINAL_STATUSES


@dataclass
class RolloutState:
    id: str
    status: RolloutStatus
    max_calls: int | None
    max_tokens: int | None
    calls: int
    tokens: int
    loaded_at: float
    calls_before: int = 0
    """Calls the store held when this process first saw the rollout."""
    refreshing: bool = False
    """A re-read from the store is in flight; other requests use this state meanwhile."""
    bodies: OrderedDict[str, tuple[str, str]] = field(default_factory=OrderedDict)
    """Request body hash -> (call id, status) of this process's recent calls, for retries."""

    def remember_body(self, digest: str, call_id: str, status: str, keep: int = 64) -> None:
        self.bodies[digest] = (call_id, status)
        self.bodies.move_to_end(digest)
        if len(self.bodies) > keep:
            self.bodies.popitem(last=False)


def request_key(request: web.Request) -> str | None:
    key = request.match_info.get("key")
    if key:
        return key
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        return auth[7:].strip()
    api_key = request.headers.get("x-api-key", "").strip()
    return api_key or None


class Rollouts:
    def __init__(
        self, store: Store, *, open_mode: bool = False, ttl: float = 2.0, size: int = 100_000
    ) -> None:
        self._store = store
        self._open_mode = open_mode
        self._ttl = ttl
        self._size = size
        self._by_hash: OrderedDict[str, RolloutState] = OrderedDict()
        self._creating: dict[str, asyncio.Lock] = {}

    async def resolve(self, key: str | None) -> RolloutState:
        if not key:
            raise Unauthorized(
                "no rollout key: use the base URL http://HOST/r/<key>/v1 or send the key as "
                "the API key",
                code="invalid_api_key",
            )
        digest = hash_key(key)
        state = self._by_hash.get(digest)
        now = time.monotonic()
        if state is not None and (now - state.loaded_at < self._ttl or state.refreshing):
            self._by_hash.move_to_end(digest)
            return state
        if state is not None:
            state.refreshing = True
        try:
            view = await self._store.rollout_by_key(key)
        finally:
            if state is not None:
                state.refreshing = False
        if view is None and self._open_mode:
            view = await self._create(key)
        if view is None:
            raise Unauthorized("unknown rollout key", code="invalid_api_key")
        if state is None or state.id != view.id:
            state = RolloutState(
                view.id,
                view.status,
                view.max_calls,
                view.max_tokens,
                view.n_calls,
                view.n_tokens,
                now,
                calls_before=view.n_calls,
            )
        else:
            # Counters are kept here as calls finish; the store may lag behind them.
            state.status, state.max_calls, state.max_tokens = (
                view.status,
                view.max_calls,
                view.max_tokens,
            )
            state.calls = max(state.calls, view.n_calls)
            state.tokens = max(state.tokens, view.n_tokens)
            state.loaded_at = now
        self._by_hash[digest] = state
        self._by_hash.move_to_end(digest)
        if len(self._by_hash) > self._size:
            self._by_hash.popitem(last=False)
        return state

    async def _create(self, key: str) -> RolloutView | None:
        lock = self._creating.setdefault(hash_key(key), asyncio.Lock())
        async with lock:
            view = await self._store.rollout_by_key(key)
            if view is None:
                await self._store.create_rollout(NewRollout(key=key, meta={"created_by": "open"}))
                view = await self._store.rollout_by_key(key)
        self._creating.pop(hash_key(key), None)
        return view

    @staticmethod
    def admit(state: RolloutState) -> None:
        """Refuse a call of a finished rollout or one whose budget is spent."""
        if state.status in FINAL_STATUSES:
            raise Forbidden(
                f"rollout {state.id} is {state.status.value}; it takes no more calls",
                code="rollout_finished",
            )
        if state.max_calls is not None and state.calls >= state.max_calls:
            raise Forbidden(
                f"rollout {state.id} used its budget of {state.max_calls} calls",
                code="rollout_budget_exceeded",
            )
        if state.max_tokens is not None and state.tokens >= state.max_tokens:
            raise Forbidden(
                f"rollout {state.id} used its budget of {state.max_tokens} tokens",
                code="rollout_budget_exceeded",
            )

    def budget_exhausted(self, state: RolloutState) -> bool:
        over_calls = state.max_calls is not None and state.calls >= state.max_calls
        over_tokens = state.max_tokens is not None and state.tokens >= state.max_tokens
        return over_calls or over_tokens

    def forget(self, key: str) -> None:
        self._by_hash.pop(hash_key(key), None)
