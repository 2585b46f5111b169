"""Per-rollout call and token budgets: reserved when a call is admitted, settled by its record.

The rules (docs/using.md, "Budgets"):

- `max_calls` counts every call the proxy did not refuse (a `rejected` call never counts). A call
  takes its place at admission, so N concurrent calls can never pass a budget of fewer.
- `max_tokens` bounds prompt + completion tokens over the rollout's calls. Prompt tokens are only
  known once the engine answers, so a call reserves at admission what it may generate (its
  `max_tokens`, or the proxy's `--max-tokens-cap`, times `n`) plus an estimate of its prompt: the
  request body's size in bytes, which no byte-level tokenizer's count exceeds. Its generation
  limit is lowered to what is left of the budget after the tokens used and those reserved by
  calls in flight, and the engine is asked for no more. When the record is written the
  reservation becomes the call's real prompt + completion tokens.
- A call that finds no other call of the rollout in flight is admitted while any budget is left,
  whatever its prompt (the estimate is pessimistic and would end rollouts early); so the one
  overshoot possible is that lone call's prompt. Calls in flight together never overshoot more.
- A call that sets no generation limit (and no cap applies) is not given one: vLLM refuses a
  `max_tokens` above its context minus the prompt, which the proxy cannot know. It reserves all
  that is left instead, so no other call of the rollout runs beside it, but it can generate past
  the budget; give harnesses a `max_tokens` or the proxy a cap for a hard bound.
- When only reservations (not spent tokens) stand in the way, a call waits for the calls in flight
  to settle instead of being refused.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from .errors import Forbidden


@dataclass(frozen=True)
class Reservation:
    calls: int
    tokens: int


@dataclass
class Admission:
    allowance: int | None
    """The most tokens each choice may generate (lowered from what was asked), or None."""


class BudgetLedger:
    """One rollout's limits, what its recorded calls used, and what calls in flight reserved."""

    def __init__(self, max_calls: int | None, max_tokens: int | None, calls: int, tokens: int):
        self.max_calls = max_calls
        self.max_tokens = max_tokens
        self.calls = calls
        """Calls counted against max_calls (recorded, not rejected)."""
        self.tokens = tokens
        """Prompt + completion tokens of the recorded calls."""
        self._reserved: dict[str, Reservation] = {}
        self.reserved_calls = 0
        self.reserved_tokens = 0
        self._waiters: list[asyncio.Future[None]] = []

    def spent(self) -> bool:
        over_calls = self.max_calls is not None and self.calls >= self.max_calls
        over_tokens = self.max_tokens is not None and self.tokens >= self.max_tokens
        return over_calls or over_tokens

    def try_reserve(
        self, rollout_id: str, call_id: str, asked: int | None, n: int, prompt_estimate: int
    ) -> Admission | None:
        """Reserve for one call; None when calls in flight hold what is left (wait, then retry).

        Raises Forbidden (code rollout_budget_exceeded) when the budget is spent for good.
        """
        if self.max_calls is not None and self.calls + self.reserved_calls >= self.max_calls:
            raise _spent(rollout_id, f"its budget of {self.max_calls} calls")
        allowance: int | None = None
        tokens = 0
        if self.max_tokens is not None:
            alone = self.reserved_tokens == 0
            left = self.max_tokens - self.tokens - self.reserved_tokens
            room = left if alone else left - prompt_estimate
            per_choice = room // n if asked is None else min(asked, room // n)
            if per_choice < 1:
                if not alone:
                    return None
                raise _spent(rollout_id, f"its budget of {self.max_tokens} tokens")
            if asked is not None:
                allowance = per_choice
            tokens = prompt_estimate + (room if asked is None else per_choice * n)
        reservation = Reservation(1, tokens)
        self._reserved[call_id] = reservation
        self.reserved_calls += reservation.calls
        self.reserved_tokens += reservation.tokens
        return Admission(allowance)

    def settle(self, call_id: str, *, counted: bool, tokens: int) -> None:
        """The call's record is written: its reservation becomes what it really used."""
        self.release(call_id)
        if counted:
            self.calls += 1
            self.tokens += tokens

    def release(self, call_id: str) -> bool:
        """Drop a call's reservation (its record settles it, or it ended without one)."""
        reservation = self._reserved.pop(call_id, None)
        if reservation is None:
            return False
        self.reserved_calls -= reservation.calls
        self.reserved_tokens -= reservation.tokens
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()
        return True

    async def settled(self) -> None:
        """Return once a call in flight released its reservation."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    @property
    def in_flight(self) -> int:
        return len(self._reserved)

    def observe(self, calls: int, tokens: int) -> None:
        """What the store counts (other proxies may share the rollout): never count less."""
        self.calls = max(self.calls, calls)
        self.tokens = max(self.tokens, tokens)


def _spent(rollout_id: str, what: str) -> Forbidden:
    return Forbidden(f"rollout {rollout_id} used {what}", code="rollout_budget_exceeded")
