"""Holding engine calls around weight updates, and the order of the policy versions.

A paused hold makes new calls wait (they are never refused); calls already dispatched either
run to their end (`drain`), are aborted by their engine and resumed after the update
(`abort_resume`: the relay records the partial answer, waits here, and continues it token-in
on the new weights), or are frozen in their engine and go on after it (`in_place`). `commit`
reopens the hold under a new version. Versions are ordered by the order they were committed
here (`epoch_of`), which is what staleness counts in: a label's text says nothing about its
age ("10" sorts before "9").
"""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass


class UpdateMode(enum.StrEnum):
    DRAIN = "drain"
    """In-flight calls finish on the old weights; the update waits for them."""
    ABORT_RESUME = "abort_resume"
    """In-flight calls are aborted now and continued on the new weights after the update."""
    IN_PLACE = "in_place"
    """In-flight calls are frozen in their engine (vLLM's `keep`, SGLang's `in_place`) and go
    on sampling on the new weights after the update, with no re-prefill: each answer records
    which of its tokens were sampled under which version (its weight spans)."""


@dataclass(frozen=True)
class WeightUpdate:
    mode: UpdateMode
    began: float
    """time.monotonic() when dispatching stopped."""


class UpdateInProgress(Exception):
    """A weight update is already under way (one at a time)."""


class WeightHold:
    def __init__(self, weight_version: str | None = None) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.inflight = 0
        self.waiting = 0
        self.weight_version = weight_version
        self.epoch = 0
        """How many versions were committed here; the initial version is epoch 0."""
        self.update: WeightUpdate | None = None
        self.aborts = 0
        """abort_resume updates begun so far: an answer that ends with "abort" after this grew
        since its dispatch was aborted by one, and is resumed."""
        self._epochs: dict[str, int] = {} if weight_version is None else {weight_version: 0}
        self._digests: dict[str, str] = {}
        """Version -> the digest of its weights' checksums, where the engines offered them."""

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    @property
    def aborting(self) -> bool:
        """True while an abort_resume update is under way: an aborted answer will be resumed."""
        return self.update is not None and self.update.mode is UpdateMode.ABORT_RESUME

    async def enter(self) -> str | None:
        """Wait while paused, then count the call as in flight; returns the version in force."""
        if not self._open.is_set():
            self.waiting += 1
            try:
                await self._open.wait()
            finally:
                self.waiting -= 1
        self.inflight += 1
        self._idle.clear()
        return self.weight_version

    async def wait_out(self) -> str | None:
        """For a call in flight that must wait for the update under way (its answer was aborted
        and resumes after it): it stops counting as in flight, so the update can go ahead, and
        counts again once the hold opens; returns the version then in force. The caller's one
        `leave` balances it either way, even if it is cancelled while waiting."""
        self.leave()
        try:
            if not self._open.is_set():
                self.waiting += 1
                try:
                    await self._open.wait()
                finally:
                    self.waiting -= 1
        finally:
            self.inflight += 1
            self._idle.clear()
        return self.weight_version

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    def pause(self) -> None:
        self._open.clear()

    async def drained(self, timeout: float | None = None) -> bool:
        """True once no call is in flight (False if the timeout passed first)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def resume(self, weight_version: str | None = None) -> None:
        """Reopen (ending any weight update); a new version counts as a commit."""
        if weight_version is not None and weight_version != self.weight_version:
            self._advance(weight_version)
        self.update = None
        self._open.set()

    def begin(self, mode: UpdateMode) -> WeightUpdate:
        """Stop dispatching for a weight update; raises UpdateInProgress during another."""
        if self.update is not None:
            raise UpdateInProgress(f"a {self.update.mode.value} weight update is under way")
        self.update = WeightUpdate(mode, time.monotonic())
        if mode is UpdateMode.ABORT_RESUME:
            self.aborts += 1
        self.pause()
        return self.update

    def commit(self, weight_version: str) -> float:
        """End the update under `weight_version`; returns how long dispatching was held."""
        began = self.update.began if self.update is not None else time.monotonic()
        self.resume(weight_version)
        return time.monotonic() - began

    def cancel(self) -> float:
        """End the update keeping the old version (the new weights never went in)."""
        began = self.update.began if self.update is not None else time.monotonic()
        self.resume()
        return time.monotonic() - began

    def epoch_of(self, weight_version: str | None) -> int:
        """When `weight_version` was committed here; a version never committed here (an engine's
        own starting label, say) counts as the initial epoch 0."""
        if weight_version is None:
            return 0
        return self._epochs.get(weight_version, 0)

    def seal(self, weight_version: str, digest: str) -> None:
        """The engines' checksums of `weight_version` hash to `digest` (store/chain.py)."""
        self._digests[weight_version] = digest

    def digest_of(self, weight_version: str | None) -> str | None:
        """The digest of the weights `weight_version` was served with; None where unknown."""
        return None if weight_version is None else self._digests.get(weight_version)

    def history(self) -> list[tuple[str, int]]:
        """(version, epoch) of every version committed here, oldest first."""
        return sorted(self._epochs.items(), key=lambda item: item[1])

    def snapshot(self) -> dict[str, object]:
        """What another replica needs to mirror this hold (proxy/control/replicated.py)."""
        return {
            "paused": self.paused,
            "update": None if self.update is None else self.update.mode.value,
            "weight_version": self.weight_version,
            "history": self.history(),
            "digests": dict(self._digests),
        }

    def adopt(self, snapshot: dict[str, object]) -> None:
        """Take over another replica's hold: its versions and their order, and whether it holds
        calls (a replica that joins, or listens again, during a weight update holds them too;
        one that missed the resume opens)."""
        history = snapshot.get("history")
        if isinstance(history, list):
            for version, epoch in history:
                self._epochs[str(version)] = int(epoch)
            self.epoch = max([self.epoch, *self._epochs.values()])
        digests = snapshot.get("digests")
        if isinstance(digests, dict):
            self._digests.update({str(k): str(v) for k, v in digests.items()})
        version = snapshot.get("weight_version")
        self.weight_version = None if version is None else str(version)
        update = snapshot.get("update")
        self.update = (
            WeightUpdate(UpdateMode(update), time.monotonic()) if isinstance(update, str) else None
        )
        if snapshot.get("paused"):
            self.pause()
        else:
            self._open.set()

    def _advance(self, weight_version: str) -> None:
        self.epoch += 1
        self._epochs[weight_version] = self.epoch
        self.weight_version = weight_version
