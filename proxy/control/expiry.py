"""Rollouts nobody finishes end `expired`: a harness pointed at `rolltap serve` by hand, a
rollout made with `POST /admin/rollouts` or by open mode. The runner and the rollout service
end their own (their rollouts belong to a batch); these have no owner but the proxy.

Every `check_every` seconds, a rollout outside any batch that is still pending or running, with
no call for `idle` seconds (from its creation when it has none) and none in flight here, ends
`expired`, its error saying why. The write only applies while it is still pending or running, so
a rollout that ends meanwhile, or proxies sharing a store that expire it together, never undo
another ending.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from ...store import DatabaseUnavailable
from ...store.events import IdleExpired
from ..context import CONTEXT, ProxyContext

log = logging.getLogger("rolltap.proxy")


async def expire_idle(ctx: ProxyContext, idle: float) -> list[str]:
    """End the idle unbatched rollouts (module docstring); their ids."""
    expired = []
    for rollout_id in await ctx.store.idle_unbatched(idle):
        if ctx.rollouts.busy(rollout_id):
            continue
        why = f"expired: no call for {idle:g} s and nothing ends it (not in a batch)"
        await ctx.store.report(rollout_id, IdleExpired(why))
        expired.append(rollout_id)
    return expired


async def expiring(app: web.Application) -> AsyncIterator[None]:
    """The proxy app's cleanup context: expire idle rollouts while it serves."""
    ctx = app[CONTEXT]
    idle = ctx.settings.rollout_expiry_seconds
    if not idle:
        yield
        return

    async def run() -> None:
        while True:
            await asyncio.sleep(min(60.0, idle / 4))
            try:
                ended = await expire_idle(ctx, idle)
            except DatabaseUnavailable:
                continue  # the next round tries again
            if ended:
                log.info("expired %d idle rollouts outside any batch", len(ended))

    task = asyncio.get_running_loop().create_task(run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
