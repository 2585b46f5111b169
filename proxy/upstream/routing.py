"""Sticky routing: each rollout stays on one backend, new rollouts go where load allows.

A rollout is assigned once, by consistent hashing with bounded loads (walk the hash ring from the
rollout's point to the first healthy backend whose in-flight count is under
ceil(c * (total in flight + 1) / healthy backends)), and then stays there while that backend is
healthy, so an agent's turns keep hitting the engine that holds its prefix cache. A backend that
fails or is removed only moves its own rollouts, each to its next point on the ring.

The ring depends only on the backend URLs, so replicas of the proxy (proxy/control/replicated.py)
route
a rollout alike; the in-flight counts are each replica's own. A proxy that sees a rollout for the
first time takes the backend of its latest recorded call (Rollouts.resolve calls `prefer`), so
replicas agree from a rollout's first recorded call on, whatever their loads.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections import OrderedDict

from ..errors import UpstreamUnavailable
from .backends import Backend, BackendPool

_VNODES = 64


def _point(value: str) -> int:
    return int.from_bytes(hashlib.blake2b(value.encode(), digest_size=8).digest(), "big")


class StickyRouter:
    def __init__(self, pool: BackendPool, load_factor: float = 1.25, remember: int = 200_000):
        self._pool = pool
        self._load_factor = load_factor
        self._remember = remember
        self._assigned: OrderedDict[str, str] = OrderedDict()
        self._ring: list[tuple[int, str]] = []
        self._ring_version = -1

    def pick(self, rollout_id: str, exclude: frozenset[str] = frozenset()) -> Backend:
        url = self._assigned.get(rollout_id)
        if url is not None and url not in exclude:
            backend = self._pool.get(url)
            if backend is not None and backend.healthy:
                self._assigned.move_to_end(rollout_id)
                return backend
        backend = self._bounded_hash(rollout_id, exclude)
        self._assigned[rollout_id] = backend.url
        self._assigned.move_to_end(rollout_id)
        if len(self._assigned) > self._remember:
            self._assigned.popitem(last=False)
        return backend

    def prefer(self, rollout_id: str, url: str) -> None:
        """Keep a rollout this proxy has not routed yet on the backend its calls went to
        (through another replica, or before this proxy restarted), while that one is healthy."""
        backend = self._pool.get(url)
        if rollout_id not in self._assigned and backend is not None and backend.healthy:
            self._assigned[rollout_id] = url

    def assigned(self, rollout_id: str) -> str | None:
        return self._assigned.get(rollout_id)

    def forget(self, rollout_id: str) -> None:
        self._assigned.pop(rollout_id, None)

    def __len__(self) -> int:
        return len(self._assigned)

    def _bounded_hash(self, rollout_id: str, exclude: frozenset[str]) -> Backend:
        if self._ring_version != self._pool.version:
            self._ring = sorted(
                (_point(f"{b.url}#{i}"), b.url)
                for b in self._pool.healthy()
                for i in range(_VNODES)
            )
            self._ring_version = self._pool.version
        candidates = [b for b in self._pool.healthy() if b.url not in exclude]
        if not candidates:
            raise UpstreamUnavailable("no healthy backend can take this call")
        total = sum(b.inflight for b in candidates)
        bound = math.ceil(self._load_factor * (total + 1) / len(candidates))
        start = bisect.bisect(self._ring, (_point(rollout_id), ""))
        for i in range(len(self._ring)):
            _, url = self._ring[(start + i) % len(self._ring)]
            backend = self._pool.get(url)
            if backend is None or url in exclude or not backend.healthy:
                continue
            if backend.inflight < bound:
                return backend
        return min(candidates, key=lambda b: b.inflight)
