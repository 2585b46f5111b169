"""The rollout page (outcome, call timeline, segments and drift, every turn), one call's page,
a call's token strip (loaded on demand), and the recorded bodies as JSON."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ..analysis.hacks import HackFlag, flags_of
from ..analysis.trajectory import Trajectory
from ..audit.integrity import RolloutIntegrity, verify_rollout
from ..audit.replay import replay_report
from ..store import CallView, NotFound, RolloutView
from . import charts
from .analysis import Analysis, breaks
from .context import CONTEXT, UIContext
from .conversation import Exchange, exchange, exchanges
from .errors import BadQuery
from .layout import Span
from .tokens import strip, window

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
TAILS = (("verifier_tail", "Verifier output"), ("harness_tail", "Harness output"))


@dataclass(frozen=True)
class CallRow:
    call: CallView
    lane: charts.Lane
    exchange: Exchange
    span: Span | None
    opens: Trajectory | None
    """The segment this call opened, if it opened one."""
    note: str | None
    """Why the call has no token strip."""


async def rollout_page(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    view, calls = await _rollout(ctx, request)
    texts = await ctx.tokenizers.for_model(view.model)
    analysis = await ctx.analyses.get(ctx.store, view, calls, texts)
    bodies = await ctx.store.rollout_bodies(view.id)
    talk = exchanges(calls, bodies)
    rows = _rows(analysis, calls, talk)
    by_call = {e.call.id: e for e in talk}
    integrity = await verify_rollout(ctx.store, view.id)
    return ctx.templates.page(
        "rollout.html",
        r=view,
        rows=rows,
        integrity=integrity,
        issues_by_seq=_issues_by_seq(integrity),
        built=analysis.built,
        breaks=await breaks(analysis, by_call, texts),
        tails=_tails(view.meta),
        run=view.meta.get("run") if isinstance(view.meta.get("run"), dict) else None,
        has_text=texts is not None,
        drift_counts=sorted(analysis.built.faithfulness.breaks.items()),
        unassembled=analysis.failure,
        replay=await replay_report(ctx.store, view.id),
        egress=await ctx.store.egress(view.id),
        hacks=flags_of(view.hack_flags),
        hacks_by_seq=_hacks_by_seq(view),
    )


async def call_page(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    view, calls = await _rollout(ctx, request)
    call = _call(calls, request)
    texts = await ctx.tokenizers.for_model(view.model)
    analysis = await ctx.analyses.get(ctx.store, view, calls, texts)
    span = analysis.layout.span(call.id)
    strip_ = None
    if span is not None:
        lo, hi = _window(span, request)
        strip_ = await strip(analysis.segment(span.segment), span, lo, hi, texts)
    row = _rows(analysis, [call], [exchange(call, await ctx.store.call_bodies(call.id))])[0]
    return ctx.templates.page(
        "call.html",
        r=view,
        row=row,
        strip=strip_,
        n_calls=len(calls),
        has_text=texts is not None,
        hacks_by_seq=_hacks_by_seq(view),
    )


async def tokens_fragment(request: web.Request) -> web.Response:
    """A window of a call's token strip, as the HTML the rollout page inserts."""
    ctx = request.app[CONTEXT]
    view, calls = await _rollout(ctx, request)
    call = _call(calls, request)
    texts = await ctx.tokenizers.for_model(view.model)
    analysis = await ctx.analyses.get(ctx.store, view, calls, texts)
    span = analysis.layout.span(call.id)
    if span is None:
        raise web.HTTPNotFound(text=f"call {call.seq} has no token-faithful answer")
    lo, hi = _window(span, request)
    shown = await strip(analysis.segment(span.segment), span, lo, hi, texts)
    return web.Response(
        text=ctx.templates.render("strip.html", strip=shown, r=view, call=call),
        content_type="text/html",
    )


async def body_json(request: web.Request) -> web.Response:
    """A recorded body as it was stored: request, engine (the engine's request) or response."""
    ctx = request.app[CONTEXT]
    view, calls = await _rollout(ctx, request)
    call = _call(calls, request)
    bodies = await ctx.store.call_bodies(call.id)
    part = request.match_info["part"]
    raw = {"request": bodies.request, "engine": bodies.engine_request, "response": bodies.response}
    body = raw.get(part)
    if body is None:
        raise web.HTTPNotFound(text=f"call {call.seq} of {view.id} has no recorded {part} body")
    return web.Response(body=body, content_type="application/json")


async def _rollout(ctx: UIContext, request: web.Request) -> tuple[RolloutView, list[CallView]]:
    rollout_id = request.match_info["rollout_id"]
    view = await ctx.store.rollout(rollout_id)
    return view, await ctx.store.calls(rollout_id)


def _call(calls: list[CallView], request: web.Request) -> CallView:
    raw = request.match_info["seq"]
    found = next((c for c in calls if str(c.seq) == raw), None)
    if found is None:
        raise NotFound(f"no call {raw} in rollout {request.match_info['rollout_id']}")
    return found


def _window(span: Span, request: web.Request) -> tuple[int, int]:
    def bound(name: str) -> int | None:
        raw = request.query.get(name)
        if raw is None or raw == "":
            return None
        if not raw.isdigit():
            raise BadQuery(f"{name} {raw!r} is not a token position")
        return int(raw)

    return window(span, bound("from"), bound("to"))


def _rows(analysis: Analysis, calls: list[CallView], talk: list[Exchange]) -> list[CallRow]:
    built = analysis.built
    lanes = charts.timeline(calls)
    opens = analysis.started_by()
    skipped = {s.call_id: s.reason for s in built.skipped}
    text_only = set(built.text_only)
    rows = []
    for call, ex in zip(calls, talk, strict=True):
        span = analysis.layout.span(call.id)
        note = None
        if call.id in skipped:
            note = f"left out of training: {skipped[call.id]}"
        elif call.id in text_only:
            note = "text only: the backend returned no token ids"
        elif span is None:
            note = "no tokens recorded"
        rows.append(CallRow(call, lanes[call.id], ex, span, opens.get(call.id), note))
    return rows


def _hacks_by_seq(view: RolloutView) -> dict[int, list[HackFlag]]:
    """The reward-hack flags each call raised, for the timeline and the turns."""
    found: dict[int, list[HackFlag]] = {}
    for flag in flags_of(view.hack_flags) or []:
        if flag.seq is not None:
            found.setdefault(flag.seq, []).append(flag)
    return found


def _issues_by_seq(integrity: RolloutIntegrity) -> dict[int, list[str]]:
    """The kinds of integrity issue each call has, for the timeline."""
    found: dict[int, list[str]] = {}
    for issue in integrity.issues:
        if issue.seq is not None:
            found.setdefault(issue.seq, []).append(issue.kind.value)
    return found


def _tails(meta: dict[str, Any]) -> list[tuple[str, str]]:
    found = []
    for key, title in TAILS:
        value = meta.get(key)
        if isinstance(value, list):
            value = "\n".join(str(line) for line in value)
        if isinstance(value, str) and value.strip():
            found.append((title, _ANSI.sub("", value)))
    return found
