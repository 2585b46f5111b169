"""Which rollout a request belongs to, and whether that rollout may still make calls.

The rollout key comes from the base URL (`/r/<key>/v1/...`) or, equally, the credential
(`Authorization: Bearer <key>` or `x-api-key: <key>`). Keys map to rollouts through the store
(which holds only hashes); states are cached and re-read every few seconds so a rollout the
runner finished elsewhere stops taking calls.

A key is revoked when its harness ends (the runner sets `key_revoked_at` in the store and, for a
proxy in its own process, `revoke` here at once): whatever the agent left behind can make no
call while the verifier runs. Open mode (a rollout made for an unknown key) applies on the TCP
listener only, never to requests from sandboxes (the unix socket's app, FOR_SANDBOXES).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ..store import DatabaseUnavailable, NewRollout, RolloutStatus, RolloutView, Store
from ..store.ids import hash_key
from ..store.store import FINAL_STATUSES
from .budget import BudgetLedger
from .errors import Forbidden, Unauthorized
from .staleness import StaleBound, rollout_bound, stale_mark
from .tokenin.lineage import Lineages
from .upstream.routing import StickyRouter
from .upstream.sampling import Sampling, rollout_sampling


@dataclass
class RolloutState:
    id: str
    status: RolloutStatus
    budget: BudgetLedger
    loaded_at: float
    used_at: float = 0.0
    """time.monotonic() of the latest request: idle states leave the cache (Rollouts.sweep)."""
    calls_before: int = 0
    """Calls the store held when this process first saw the rollout."""
    refreshing: bool = False
    """A re-read from the store is in flight; other requests use this state meanwhile."""
    bodies: OrderedDict[str, tuple[str, str]] = field(default_factory=OrderedDict)
    """Request body hash -> (call id, status) of this process's recent calls, for retries."""
    answered_at: dict[str, float] = field(default_factory=dict)
    """Request body hash -> time.monotonic() its latest call was recorded (kept with bodies)."""
    drawing: dict[str, tuple[str, asyncio.Future[None]]] = field(default_factory=dict)
    """Request body hash -> (call id, done) of its call being sampled now: a retry of it waits
    for its record (proxy/replay/retries.py)."""
    revoked: bool = False
    """The harness ended: every later call is refused."""
    sampling: Sampling | None = None
    """What the rollout's batch imposes on every call, seeds included
    (proxy/upstream/sampling.py)."""
    dispatched: int = 0
    """Engine calls of the rollout so far (the store's count when this process first saw it,
    then this process's): a call's place, from which its derived seed follows."""
    token_in: bool | None = None
    """The rollout's own choice of token-in mode (`token_in` in its metadata); None: the
    proxy's default."""
    lineages: Lineages = field(default_factory=Lineages)
    """Its conversations' recent turns, for token-in (proxy/tokenin/lineage.py)."""
    routed_experts: bool | None = None
    """The rollout's own choice to capture routed experts (`routed_experts` in its metadata;
    proxy/upstream/routed.py); None: the proxy's default."""
    stale_bound: StaleBound | None = None
    """Its batch's bound on how far behind its calls may run (proxy/staleness.py)."""
    oldest_version: str | None = None
    """The weight version of its oldest recorded answer, once one is recorded."""
    stale_marked: bool = False
    """The bound has recorded what it did to the rollout (meta["stale"])."""

    def saw_version(self, version: str | None) -> None:
        """A call of the rollout was recorded with `version` (the oldest is kept)."""
        if self.oldest_version is None:
            self.oldest_version = version

    def remember_body(self, digest: str, call_id: str, status: str, keep: int = 64) -> None:
        self.bodies[digest] = (call_id, status)
        self.bodies.move_to_end(digest)
        self.answered_at[digest] = time.monotonic()
        if len(self.bodies) > keep:
            old, _ = self.bodies.popitem(last=False)
            self.answered_at.pop(old, None)
        drawn = self.drawing.get(digest)
        if drawn is not None and drawn[0] == call_id:
            del self.drawing[digest]
            if not drawn[1].done():
                drawn[1].set_result(None)

    def draws(self, digest: str, call_id: str) -> None:
        """Call `call_id` with this body is being sampled (the first, while another is not)."""
        if digest not in self.drawing:
            self.drawing[digest] = (call_id, asyncio.get_running_loop().create_future())


def _chosen(meta: dict[str, Any], key: str) -> bool | None:
    chosen = meta.get(key)
    return chosen if isinstance(chosen, bool) else None


FOR_SANDBOXES = web.AppKey("rolltap_for_sandboxes", bool)
"""Set on the app behind the sandboxes' unix socket."""


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
        self,
        store: Store,
        *,
        router: StickyRouter | None = None,
        open_mode: bool = False,
        ttl: float = 2.0,
        size: int = 100_000,
    ) -> None:
        self._store = store
        self._router = router
        self._open_mode = open_mode
        self._ttl = ttl
        self._size = size
        self._by_hash: OrderedDict[str, RolloutState] = OrderedDict()
        """Key hash -> state of rollouts that may still take calls, least recently used first."""
        self._digests: dict[str, str] = {}
        """Rollout id -> key hash, to forget a rollout by its id."""
        self._creating: dict[str, asyncio.Lock] = {}

    def __len__(self) -> int:
        return len(self._by_hash)

    async def resolve_request(self, request: web.Request) -> RolloutState:
        """The request's rollout; on the sandboxes' socket an unknown key is never created."""
        key = request_key(request)
        return await self.resolve(key, create=not request.app.get(FOR_SANDBOXES, False))

    async def resolve(self, key: str | None, *, create: bool = True) -> RolloutState:
        """create: in open mode, make a rollout for an unknown key."""
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
            state.used_at = now
            return state
        if state is not None:
            state.refreshing = True
        # A refresh counts the rollout's calls only for a budget; its status, limits and key
        # come from its row alone.
        budgeted = state is not None and (
            state.budget.max_calls is not None or state.budget.max_tokens is not None
        )
        try:
            view = await self._store.rollout_by_key(key, counted=state is None or budgeted)
        except DatabaseUnavailable:
            if state is None:
                raise
            # Keep serving from what we know while the database is away; calls still wait for
            # their records, so nothing is lost, and the next refresh comes a TTL later.
            state.loaded_at = now
            return state
        finally:
            if state is not None:
                state.refreshing = False
        if view is None and self._open_mode and create:
            view = await self._create(key)
        if view is None:
            raise Unauthorized(
                "unknown rollout key: use the key POST /admin/rollouts returned, or start "
                "`rolltap serve --open` to make a rollout for any key (local experiments)",
                code="invalid_api_key",
            )
        counted = view.n_calls - view.n_rejected
        # Concurrent first requests of a rollout each read it: they must share one state (one
        # budget), so take the one another request stored meanwhile.
        state = self._by_hash.get(digest, state)
        if state is None or state.id != view.id:
            budget = BudgetLedger(view.max_calls, view.max_tokens, counted, view.n_tokens)
            state = RolloutState(
                view.id,
                view.status,
                budget,
                now,
                calls_before=view.n_calls,
                sampling=rollout_sampling(view.meta, view.task_id, view.sample_index, view.attempt),
                dispatched=counted,
                token_in=_chosen(view.meta, "token_in"),
                routed_experts=_chosen(view.meta, "routed_experts"),
                stale_bound=rollout_bound(view.meta),
                stale_marked=stale_mark(view.meta) is not None,
            )
            if view.n_calls and state.stale_bound is not None:
                state.oldest_version = await self._store.first_weight_version(view.id)
            if view.n_calls and view.status not in FINAL_STATUSES and self._router is not None:
                backend = await self._store.last_backend(view.id)
                if backend is not None:
                    self._router.prefer(view.id, backend)
        else:
            # Counters are kept here as calls finish; the store may lag behind them, and a read
            # that began before this process ended the rollout must not undo that.
            if state.status not in FINAL_STATUSES:
                state.status = view.status
            state.budget.max_calls, state.budget.max_tokens = view.max_calls, view.max_tokens
            state.budget.observe(counted, view.n_tokens)
            state.loaded_at = now
        state.revoked = state.revoked or view.key_revoked_at is not None
        state.used_at = now
        if state.status in FINAL_STATUSES and not state.budget.in_flight:
            # A finished rollout is refused from this state and not kept: finished rollouts
            # must not fill the cache (a later call reads the store again).
            self._drop(digest)
            return state
        self._by_hash[digest] = state
        self._by_hash.move_to_end(digest)
        self._digests[state.id] = digest
        if len(self._by_hash) > self._size:
            self._drop(next(iter(self._by_hash)))
        return state

    def forget_rollout(self, rollout_id: str) -> None:
        """Drop a finished rollout's state, unless calls are still in flight on it (their
        budget lives there; the idle sweep drops it later)."""
        digest = self._digests.get(rollout_id)
        state = None if digest is None else self._by_hash.get(digest)
        if digest is not None and (state is None or not state.budget.in_flight):
            self._drop(digest)

    def busy(self, rollout_id: str) -> bool:
        """Whether a call of the rollout is in flight in this process."""
        digest = self._digests.get(rollout_id)
        state = None if digest is None else self._by_hash.get(digest)
        return state is not None and bool(state.budget.in_flight)

    def sweep(self, idle: float) -> list[str]:
        """Drop states unused for `idle` seconds (none with calls in flight); their ids."""
        cutoff = time.monotonic() - idle
        dropped = []
        for digest, state in list(self._by_hash.items()):
            if state.used_at >= cutoff:
                break  # least recently used first: the rest are newer
            if state.budget.in_flight:
                continue
            self._drop(digest)
            dropped.append(state.id)
        return dropped

    def _drop(self, digest: str) -> None:
        state = self._by_hash.pop(digest, None)
        if state is not None and self._digests.get(state.id) == digest:
            del self._digests[state.id]

    async def _create(self, key: str) -> RolloutView | None:
        lock = self._creating.setdefault(hash_key(key), asyncio.Lock())
        async with lock:
            view = await self._store.rollout_by_key(key)
            if view is None:
                await self._store.create_rollout(NewRollout(key=key, meta={"created_by": "open"}))
                view = await self._store.rollout_by_key(key)
        self._creating.pop(hash_key(key), None)
        return view

    def revoke(self, key: str) -> None:
        """Refuse the key's calls from now on (the store holds the revocation for other
        processes; this one need not wait for its next re-read)."""
        state = self._by_hash.get(hash_key(key))
        if state is not None:
            state.revoked = True

    @staticmethod
    def refuse_revoked(state: RolloutState) -> None:
        if state.revoked:
            raise Forbidden(
                f"rollout {state.id}'s key was revoked when its harness ended; "
                "calls made after that are refused",
                code="rollout_key_revoked",
            )

    @staticmethod
    def admit(state: RolloutState) -> None:
        """Refuse a call of a revoked key or a finished rollout (budgets: proxy/budget.py)."""
        Rollouts.refuse_revoked(state)
        if state.status in FINAL_STATUSES:
            raise Forbidden(
                f"rollout {state.id} is {state.status.value}; it takes no more calls",
                code="rollout_finished",
            )

    def forget(self, key: str) -> None:
        self._drop(hash_key(key))
