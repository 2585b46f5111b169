"""A batch's bound on staleness, checked where each call of a rollout is dispatched: as the
weight-update hold lets the call through to an engine (proxy/upstream/call.py, relay.py). What
the bound is and what its policies do: staleness.py."""

from __future__ import annotations

from typing import Any

from ...store.events import StaleDropped, StaleMarked
from ...store.lifecycle import status_of
from ..context import ProxyContext
from ..errors import StaleRollout
from ..rollouts import RolloutState
from ..staleness import ENDS_ROLLOUT, MARK, StalePolicy


async def hold_bound(ctx: ProxyContext, state: RolloutState) -> None:
    """Check the rollout against its bound as the hold lets one of its calls through; raises
    StaleRollout when the call must not reach an engine."""
    bound, oldest = state.stale_bound, state.oldest_version
    if bound is None or oldest is None:
        return
    gap = ctx.hold.epoch - ctx.hold.epoch_of(oldest)
    if gap <= bound.max_staleness:
        return
    ends = bound.policy in ENDS_ROLLOUT
    then = "run again as a new attempt" if bound.policy is StalePolicy.RELAUNCH else "dropped"
    message = (
        f"rollout {state.id} is stale: its first answer was sampled with weight version "
        f"{oldest!r}, {gap} update(s) ago, and its batch allows {bound.max_staleness}; it is {then}"
    )
    if not state.stale_marked:
        # Before the first await: concurrent calls of the rollout find it marked (and ended).
        state.stale_marked = True
        mark: dict[str, Any] = {
            "action": bound.policy.value,
            "gap": gap,
            "max_staleness": bound.max_staleness,
            "oldest_version": oldest,
            "version": ctx.hold.weight_version,
        }
        # meta["stale"] (and, when the bound ends the rollout, its ending) in one write; a
        # rollout something else ended meanwhile keeps its own ending.
        event: StaleDropped | StaleMarked
        if ends:
            event = StaleDropped(message, {MARK: mark})
            state.status = status_of(event)
        else:
            event = StaleMarked({MARK: mark})
        await ctx.store.report(state.id, event)
    if ends:
        raise StaleRollout(message, code="rollout_stale")
