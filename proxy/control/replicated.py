"""Control orders that hold on every replica: pause/resume, weight updates, the backend set.

Replicas of one proxy share a PostgreSQL store (docs/scale.md). What they share through it:

- Rollouts, keys and calls: any replica resolves any key and records any call. Call sequence
  numbers are taken by the store's writer under the rollout row's lock
  (store/queries.py:lock_chain_ends), so replicas appending to one rollout never collide.
- Budgets: each replica counts the calls it admits and re-reads the store's counts every few
  seconds (proxy/rollouts.py); a rollout whose calls are spread over replicas can overshoot by
  what the other replicas admitted since their last re-read.
- Routing: every replica builds the same hash ring from the same backend URLs
  (proxy/upstream/routing.py), so a rollout's calls reach one backend from any replica. The load
  bound is
  each replica's own: a replica whose share of a backend is over its bound sends a new rollout
  to the next backend on the ring, and only then can two replicas disagree about it.
- The hold and the backend set: here. The replica that takes an admin or /v1/weights call
  applies it to itself and publishes it (proxy/control_bus.py); every other replica applies
  it
  and replies `held` once it holds new calls and `drained` once its calls in flight ended. So
  pause, `begin` and their `drained` answers speak for every replica, an abort_resume update
  aborts the engines only once every replica expects it, and commits advance the version on
  every replica in the same order. A replica that starts later asks for the others' hold.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ..context import ProxyContext
from ..control_bus import Order, Sent, SoloBus
from ..errors import Conflict
from ..hold import UpdateInProgress, UpdateMode
from ..upstream.backends import Backend, parse_backend
from . import engine_control

HELD_WITHIN = 10.0
"""Seconds a replica has to confirm it holds new calls."""
STATE_WITHIN = 2.0
"""Seconds a starting replica waits for another's hold."""


async def join(ctx: ProxyContext) -> None:
    """Start listening; with other replicas live, take over their hold (again after the
    listening connection was lost and restored)."""
    await ctx.bus.start(lambda order: apply(ctx, order), lambda: _take_state(ctx))


async def _take_state(ctx: ProxyContext) -> None:
    sent = await ctx.bus.publish("hello")
    if sent.peers:
        states = await ctx.bus.replies(sent, "state", STATE_WITHIN)
        if states:
            ctx.hold.adopt(next(iter(states.values())))


def check_reach(ctx: ProxyContext) -> None:
    """Refuse an order that could not reach the other workers of this port (SQLite)."""
    if ctx.settings.workers > 1 and isinstance(ctx.bus, SoloBus):
        raise Conflict(
            f"this proxy is one of {ctx.settings.workers} workers on a SQLite store, which "
            "cannot pass this order on to the others; run the workers on PostgreSQL, or one "
            "worker",
            code="workers_without_replication",
        )


async def pause(ctx: ProxyContext, wait: float | None) -> dict[str, Any]:
    """Hold new calls on every replica; with `wait`, until their calls in flight ended."""
    check_reach(ctx)
    ctx.hold.pause()
    sent = await ctx.bus.publish("pause", {"wait": wait})
    held = await ctx.bus.replies(sent, "held", HELD_WITHIN)
    if wait:
        local = await ctx.hold.drained(wait)
        drained = local and _all(sent, await _drained(ctx, sent, wait))
    inflight = ctx.hold.inflight + sum(int(h.get("inflight", 0)) for h in held.values())
    if not wait:
        drained = inflight == 0
    return {
        "paused": True,
        "drained": drained,
        "inflight": inflight,
        "replicas": _replicas(sent, held),
    }


async def resume(ctx: ProxyContext, version: str | None) -> None:
    check_reach(ctx)
    ctx.hold.resume(version)
    await ctx.bus.publish("resume", {"version": version})


async def begin(ctx: ProxyContext, mode: UpdateMode, timeout: float) -> dict[str, Any]:
    """This replica's hold has begun `mode`: stop dispatching on the others too, then pause
    every engine in the mode's own way (proxy/control/engine_control.py) once every replica
    expects it, and, but in_place, wait for every replica's calls in flight."""
    sent = await ctx.bus.publish("begin", {"mode": mode.value, "timeout": timeout})
    held = await ctx.bus.replies(sent, "held", HELD_WITHIN)
    session, backends = ctx.client(), engine_control.controlled(ctx.pool.all())

    async def pause(backend: Backend) -> engine_control.ControlResult | None:
        route = engine_control.pause_route(backend.kind, mode)
        return await engine_control.send(session, backend, route, timeout + 5.0)

    if mode is UpdateMode.IN_PLACE:
        # Nothing drains: the calls in flight stay frozen in their engines through the update.
        first = await engine_control.each(backends, pause)
        drained, later = True, []
    else:
        first, local, others = await asyncio.gather(
            engine_control.each(backends, pause),
            ctx.hold.drained(timeout),
            _drained(ctx, sent, timeout),
        )
        drained = local and _all(sent, others)

        async def once_idle(backend: Backend) -> engine_control.ControlResult | None:
            if engine_control.pause_route(backend.kind, mode) is not None:
                return None
            route = engine_control.drained_pause_route(backend.kind)
            return await engine_control.send(session, backend, route)

        later = await engine_control.each(backends, once_idle)
    answer: dict[str, Any] = {
        "drained": drained,
        "paused": [r.as_dict() for r in first + later],
        "replicas": _replicas(sent, held),
    }
    if mode is UpdateMode.ABORT_RESUME:
        # The engines paused before draining are the ones that aborted (vLLM's mode=abort).
        answer["aborted"] = [r.as_dict() for r in first]
    return answer


async def commit(ctx: ProxyContext, version: str, digest: str | None = None) -> float:
    """Reopen every replica under `version`, with its weights' digest where one was read."""
    if digest is not None:
        ctx.hold.seal(version, digest)
    held = ctx.hold.commit(version)
    await ctx.bus.publish("commit", {"version": version, "digest": digest})
    return held


async def cancel(ctx: ProxyContext) -> tuple[float, list[engine_control.ControlResult]]:
    """End the update on the old version: the engines resume, then every replica reopens."""
    resumed = await resume_engines(ctx)
    held = ctx.hold.cancel()
    await ctx.bus.publish("cancel")
    return held, resumed


async def resume_engines(ctx: ProxyContext) -> list[engine_control.ControlResult]:
    session = ctx.client()

    async def one(backend: Backend) -> engine_control.ControlResult | None:
        route = engine_control.resume_route(backend.kind)
        return await engine_control.send(session, backend, route)

    return await engine_control.each(engine_control.controlled(ctx.pool.all()), one)


async def add_backend(ctx: ProxyContext, spec: str) -> None:
    await ctx.bus.publish("backend_add", {"spec": spec})


async def remove_backend(ctx: ProxyContext, url: str) -> None:
    await ctx.bus.publish("backend_remove", {"url": url})


async def apply(ctx: ProxyContext, order: Order) -> None:
    """Another replica's order, applied here. The hold changes before the first await (the bus
    relies on it to keep orders in sequence)."""
    hold, args = ctx.hold, order.args
    if order.op == "hello":
        await ctx.bus.reply(order, "state", hold.snapshot())
    elif order.op == "pause":
        hold.pause()
        await _hold_then_drain(ctx, order, args.get("wait"))
    elif order.op == "begin":
        # A replica already in an update holds all the same; its calls drain as well.
        with contextlib.suppress(UpdateInProgress):
            hold.begin(UpdateMode(str(args["mode"])))
        await _hold_then_drain(ctx, order, float(args.get("timeout") or 0.0))
    elif order.op == "resume":
        hold.resume(_version(args))
    elif order.op == "commit":
        version = _version(args)
        if version is not None:
            if isinstance(args.get("digest"), str):
                hold.seal(version, args["digest"])
            hold.commit(version)
    elif order.op == "cancel":
        hold.cancel()
    elif order.op == "backend_add":
        url, kind = parse_backend(str(args["spec"]))
        ctx.pool.add(url, kind)
        if ctx.session is not None:
            await ctx.pool.check_all(ctx.session, timeout=2.0)
    elif order.op == "backend_remove":
        ctx.pool.remove(str(args["url"]))


async def _hold_then_drain(ctx: ProxyContext, order: Order, wait: object) -> None:
    await ctx.bus.reply(order, "held", {"inflight": ctx.hold.inflight})
    if isinstance(wait, int | float) and wait > 0:
        drained = await ctx.hold.drained(float(wait))
        await ctx.bus.reply(order, "drained", {"drained": drained})


async def _drained(ctx: ProxyContext, sent: Sent, timeout: float | None) -> dict[str, bool]:
    # A replica gets the whole timeout to drain; its reply needs a moment more to arrive.
    within = (timeout or 0.0) + 5.0
    replies = await ctx.bus.replies(sent, "drained", within)
    return {peer: bool(r.get("drained")) for peer, r in replies.items()}


def _all(sent: Sent, drained: dict[str, bool]) -> bool:
    return all(drained.get(peer, False) for peer in sent.peers)


def _replicas(sent: Sent, held: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Which other replicas confirmed holding their calls (one that did not is named)."""
    return {
        "others": len(sent.peers),
        "held": len(held),
        "missing": sorted(sent.peers - held.keys()),
    }


def _version(args: dict[str, Any]) -> str | None:
    version = args.get("version")
    return None if version is None else str(version)


def spawn_cancel(ctx: ProxyContext) -> None:
    """Cancel from a timer (a weight update's lease ran out)."""
    asyncio.get_running_loop().create_task(cancel(ctx))
