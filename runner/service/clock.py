"""The policy's version clock as the rollout service reads it: how stale a sample is.

Staleness counts weight updates: a sample whose oldest call was sampled with the version
committed at epoch e is `epoch - e` versions old (see rolltap.proxy.hold). In
`serve --runner` the clock is the proxy's own hold; a service running as its own process reads the
proxy's
GET /v1/weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from ...proxy.hold import WeightHold


@dataclass(frozen=True)
class VersionClock:
    epoch: int
    """Weight updates committed so far."""
    epochs: Mapping[str, int]
    """Version label -> the epoch it was committed at."""
    version: str | None

    def staleness(self, oldest_version: str | None) -> int:
        """Updates since `oldest_version` was committed (one never committed counts as 0)."""
        if oldest_version is None:
            return self.epoch
        return self.epoch - self.epochs.get(oldest_version, 0)


class PolicyClock(Protocol):
    async def read(self) -> VersionClock: ...


class HoldClock:
    """The clock of the proxy this service runs in."""

    def __init__(self, hold: WeightHold) -> None:
        self._hold = hold

    async def read(self) -> VersionClock:
        hold = self._hold
        return VersionClock(hold.epoch, dict(hold.history()), hold.weight_version)


class RemoteClock:
    """The clock of a proxy running elsewhere, read from its GET /v1/weights."""

    def __init__(self, proxy_url: str, admin_token: str | None) -> None:
        self._url = proxy_url.rstrip("/") + "/v1/weights"
        self._headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}

    async def read(self) -> VersionClock:
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                self._url, headers=self._headers, timeout=aiohttp.ClientTimeout(total=10)
            ) as resp,
        ):
            resp.raise_for_status()
            doc = await resp.json()
        epochs = {str(h["version"]): int(h["epoch"]) for h in doc.get("history", [])}
        return VersionClock(int(doc.get("epoch", 0)), epochs, doc.get("weight_version"))
