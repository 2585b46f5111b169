"""What the engine side of one call needs from the proxy above it, as Protocols (the seam).

upstream/ imports nothing above it: the proxy's context, the weight-update hold, the rollout and
the call as the proxy took it in reach `EngineCall` (call.py) and `relay` (relay.py) as these.
The proxy's own are context.py's ProxyContext (`Engines`), hold.py's WeightHold
(`Hold`), rollouts.py's RolloutState (`Rollout`) and intake.py's Intake (`Leg`).
"""

from __future__ import annotations

from typing import Protocol

import aiohttp

from ..metrics import ProxyMetrics
from .backends import BackendPool
from .exchange import Exchange
from .routing import StickyRouter
from .sampling import Sampling


class Settings(Protocol):
    """The proxy's settings an engine call reads."""

    @property
    def connect_timeout(self) -> float: ...

    @property
    def read_timeout(self) -> float: ...

    @property
    def cache_salt(self) -> bool: ...

    @property
    def max_tokens_cap(self) -> int | None: ...


class Hold(Protocol):
    """The weight-update hold as a call passes it."""

    @property
    def aborts(self) -> int:
        """abort_resume updates begun so far: an abort after the call was dispatched resumes."""
        ...

    async def enter(self) -> str | None:
        """Wait while paused, then count the call as in flight; the version in force."""
        ...

    async def wait_out(self) -> str | None:
        """Wait out the update under way (an aborted answer resumes after it)."""
        ...

    def leave(self) -> None: ...


class Engines(Protocol):
    """The engines a call can reach, and what it passes on the way."""

    @property
    def settings(self) -> Settings: ...

    @property
    def pool(self) -> BackendPool: ...

    @property
    def router(self) -> StickyRouter: ...

    @property
    def hold(self) -> Hold: ...

    @property
    def metrics(self) -> ProxyMetrics: ...

    def client(self) -> aiohttp.ClientSession: ...


class Rollout(Protocol):
    """The call's rollout, as its engine call draws on it."""

    dispatched: int
    """Engine calls of the rollout so far: a call's place, from which its seed derives."""

    @property
    def sampling(self) -> Sampling | None:
        """What the rollout's batch imposes on every call (sampling.py)."""
        ...


class Leg(Protocol):
    """One call as the proxy took it in: its exchange, its rollout, the engines, and what the
    proxy does at the hold and at the record."""

    @property
    def ctx(self) -> Engines: ...

    @property
    def state(self) -> Rollout: ...

    @property
    def exchange(self) -> Exchange: ...

    async def record(self, exchange: Exchange) -> None:
        """Make `exchange` (this call, or the part of it an update aborted) durable under the
        call's rollout and count it there."""
        ...

    async def bound(self) -> None:
        """The rollout's staleness bound, checked as the hold lets the call through to an
        engine; raises StaleRollout (errors.py) when the call must not reach one."""
        ...
