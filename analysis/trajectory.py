"""Training trajectories: each segment of a rollout as token arrays a trainer can use directly.

Reading
-------
::

    import rolltap.store
    from rolltap.analysis.reader import trajectories
    with rolltap.store.open("postgresql+asyncpg://rl@db/rolltap") as store:
        for t in trajectories(store, batch="step-12", status="finished"):
            t.prompt_ids, t.response_ids, t.loss_mask, t.logprobs, t.reward

One `Trajectory` per segment (a rollout can yield several). A segment is a run of calls whose
prompts each extend the previous call's prompt plus the tokens it sampled, so:

* ``prompt_ids``: the first call's prompt, exactly as the engine saw it;
* ``response_ids``: everything after it: the sampled tokens of every merged call and, between
  them, the tokens the model did not sample (tool results, user turns, template glue);
* ``loss_mask``: 1 on sampled tokens, 0 elsewhere, aligned with ``response_ids``;
* ``logprobs``: the engine's logprob of each sampled token, 0.0 where the mask is 0 (NaN where the
  engine returned none: then ``has_logprobs`` is False).

Every mask-1 token sits in exactly the context it was sampled in. Where a harness broke the chain
the rollout splits; ``link`` says which earlier segment, call and choice the new segment branched
from, at which token, and the drift class (see `rolltap.analysis.drift`). Text-only calls, failed
calls and superseded retries never yield a trajectory.

Versions and steps: ``weight_versions`` holds the policy version of each merged call and
``min_version``/``max_version`` the oldest and newest version that sampled any of its tokens (a
rollout that straddled a weight update carries both). ``weight_spans`` says which version
sampled which tokens: ``(version, start, end)`` over ``response_ids``, one per answer, or more
where an answer was frozen across an in_place update and went on under the new weights.
``turns`` spans every answer (the call that sampled it, its version) and every observation
between two answers (with a stable hash of its tokens, ``observation_hashes``) in
``response_ids`` coordinates; ``prompt_hash`` hashes the prompt the same way (see
`rolltap.analysis.steps`).

Routing replay (R3): ``routed_experts`` holds, for a rollout whose calls captured them, the MoE
experts each token was routed to: ``n_tokens - 1`` rows aligned with ``prompt_ids`` then
``response_ids``, from the segment's last call; None when that call has none (see
`rolltap.store.routed`).

Field names for trainers
------------------------
=======================  ==========================  ===================================
rolltap (and export)     verl ``AgentLoopOutput``    SkyRL ``GeneratorOutput``
=======================  ==========================  ===================================
``prompt_ids``           ``prompt_ids``              ``prompt_token_ids``
``response_ids``         ``response_ids``            ``response_ids``
``loss_mask``            ``response_mask``           ``loss_masks``
``logprobs``             ``response_logprobs``       ``rollout_logprobs``
``reward``               ``reward_score``            ``rewards``
``rollout_id:segment``   ``request_id``              ``trajectory_ids``
``task_id`` + ``sample_index``  GRPO group (``uid``)  ``trajectory_ids`` instance / repetition
=======================  ==========================  ===================================

`Trajectory` also answers to ``prompt_token_ids``, ``rollout_logprobs`` and ``response_mask``.
The reward is the rollout's; ``role`` (main, side, sibling) lets a trainer decide whether side
calls (titles, summaries, sub-agents) and ``n > 1`` siblings share it. ``lost_tokens`` counts
sampled tokens that a later break did not carry over verbatim: they are still exact here (trained
in their own context), but the harness changed them before the model saw them again.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from ..audit.replay import REPLAY_OF
from ..store import compress, routed
from ..store.database import Database
from ..store.delta import StoredPrompt, rebuild_prompts
from ..store.models import (
    CallDialect,
    CallStatus,
    Capture,
    LinkKind,
    RolloutStatus,
    call_body_table,
    call_table,
    choice_table,
    rollout_faithfulness_table,
    segment_break_table,
)
from ..store.packing import IdArray, LogprobArray, RoutingArray, unpack_ids, unpack_logprobs
from ..store.records import ChoiceTokens, RolloutView
from . import hacks
from .drift import CallMessages, Detokenizer, Drift, break_sites, calls_to_read, classify_all
from .lines import CALL_COLUMNS, CHOICE_COLUMNS, Line, Row, choice_spans, line_of
from .segments import (
    Assembly,
    CallInput,
    MaskArray,
    SegmentArrays,
    SegmentRole,
    Skipped,
    assemble,
)
from .steps import TurnSpan, token_hash, turn_spans, version_range

C = call_table
CH = choice_table
B = call_body_table
SB = segment_break_table
RF = rollout_faithfulness_table
# Column values to enum members by a dict lookup: Enum(value) costs more than the rest of a row.
_STATUS = {s.value: s for s in CallStatus}
_CAPTURE = {c.value: c for c in Capture}
_DIALECT = {d.value: d for d in CallDialect}


@dataclass(frozen=True)
class SegmentLink:
    kind: LinkKind
    parent_segment: int
    call_id: str
    """The earlier call this segment branched from."""
    choice: int | None
    """That call's choice the shared prefix runs into; None when it ends inside its prompt."""
    position: int
    """Index of the first token that differs from the parent's sequence."""
    drift: Drift | None = None
    """Why the chain broke (breaks only; side calls and siblings have none)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "parent_segment": self.parent_segment,
            "call_id": self.call_id,
            "choice": self.choice,
            "position": self.position,
            "drift": None if self.drift is None else self.drift.as_dict(),
        }


@dataclass(frozen=True)
class Trajectory:
    rollout_id: str
    segment: int
    role: SegmentRole
    prompt_ids: IdArray
    response_ids: IdArray
    loss_mask: MaskArray
    logprobs: LogprobArray
    reward: float | None
    status: RolloutStatus
    batch_id: str | None
    task_id: str | None
    sample_index: int | None
    call_ids: tuple[str, ...]
    """The merged calls, in order."""
    weight_versions: tuple[str | None, ...]
    """The policy version each merged call was sampled with."""
    prompt_hash: str
    """The stable hash (`rolltap.analysis.steps.token_hash`) of `prompt_ids`: the first state."""
    finish_reason: str | None
    """How the last merged call's sampling ended (stop, length, tool_calls...)."""
    link: SegmentLink | None
    sampled_tokens: int
    lost_tokens: int
    has_logprobs: bool
    rollout_faithfulness: float
    """The rollout's share of sampled tokens still in the context they were sampled in."""
    head_hash: str | None = None
    """The rollout's sealed hash-chain head (store/chain.py): which record this came from."""
    n_segments: int = 1
    """How many trajectories its rollout has: `reward` is the rollout's, repeated on each of
    them, so weight a row by 1 / n_segments to count each rollout once."""
    replay_of: str | None = None
    """The rollout this one replays (`rolltap replay`): its tokens came from that record, so a
    trainer must not count them twice."""
    routed_experts: RoutingArray | None = None
    """The MoE experts each token was routed to (R3), row i for token i of `prompt_ids` then
    `response_ids` (n_tokens - 1 rows: the last token was never forwarded), from the segment's
    last call; None when that call has none (store/routed.py)."""
    hack_flags: tuple[str, ...] | None = None
    """The reward-hack detectors that flagged its rollout (analysis/hacks.py), sorted; () when
    none did, None when it was never checked: a trainer should not learn from a flagged one."""

    _answers: tuple[tuple[int, int], ...] = field(default=(), repr=False, compare=False)
    """Each merged call's sampled span of `response_ids`: what `turns` is worked out from."""
    _call_spans: tuple[list[list[Any]] | None, ...] = field(default=(), repr=False, compare=False)
    """Per merged call, the versions that sampled its answer where more than one did
    ([[version, start, end], ...] over the answer's own tokens; store/records.py WeightSpans)."""

    @functools.cached_property
    def weight_spans(self) -> tuple[tuple[str | None, int, int], ...]:
        """Which version sampled which tokens: (version, start, end) over `response_ids`."""
        out: list[tuple[str | None, int, int]] = []
        spans = self._call_spans or (None,) * len(self._answers)
        for (start, end), version, own in zip(
            self._answers, self.weight_versions, spans, strict=True
        ):
            if not own:
                out.append((version, start, end))
                continue
            for label, a, b in own:
                out.append(
                    (str(label), start + min(int(a), end - start), start + min(int(b), end - start))
                )
        return tuple(out)

    @property
    def _sampled_versions(self) -> list[str | None]:
        """Every version that sampled some of its tokens, in the order they sampled them."""
        if not any(self._call_spans):
            return list(self.weight_versions)
        return [version for version, _, _ in self.weight_spans]

    @functools.cached_property
    def turns(self) -> tuple[TurnSpan, ...]:
        """Every answer and every observation between two answers, as spans of `response_ids`
        (worked out on first use: hashing every observation was a tenth of an export's CPU, and
        an export never reads them)."""
        return turn_spans(self.response_ids, self._answers, self.call_ids, self.weight_versions)

    @property
    def prompt_token_ids(self) -> IdArray:
        return self.prompt_ids

    @property
    def rollout_logprobs(self) -> LogprobArray:
        return self.logprobs

    @property
    def response_mask(self) -> MaskArray:
        return self.loss_mask

    @property
    def n_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def min_version(self) -> str | None:
        """The oldest policy version any of its tokens was sampled with."""
        return version_range(self._sampled_versions)[0]

    @property
    def max_version(self) -> str | None:
        """The newest policy version any of its tokens was sampled with (an answer frozen
        across an in_place update ends under the new one)."""
        return version_range(self._sampled_versions)[1]

    @property
    def observation_hashes(self) -> tuple[str, ...]:
        """The hash of every observation, in order (GiGPO-style anchor states)."""
        return tuple(t.token_hash for t in self.turns if t.token_hash is not None)


@dataclass(frozen=True)
class Faithfulness:
    sampled_tokens: int
    lost_tokens: int
    breaks: dict[str, int]
    """Breaks by drift class."""
    segments: int
    side_calls: int
    siblings: int
    text_only_calls: int
    skipped_calls: int

    @property
    def share(self) -> float:
        """Sampled tokens that every later call of their line saw verbatim, over all sampled."""
        if self.sampled_tokens == 0:
            return 1.0
        return 1.0 - self.lost_tokens / self.sampled_tokens

    def as_dict(self) -> dict[str, Any]:
        return {
            "share": self.share,
            "sampled_tokens": self.sampled_tokens,
            "lost_tokens": self.lost_tokens,
            "breaks": dict(self.breaks),
            "segments": self.segments,
            "side_calls": self.side_calls,
            "siblings": self.siblings,
            "text_only_calls": self.text_only_calls,
            "skipped_calls": self.skipped_calls,
        }


@dataclass(frozen=True)
class RolloutTrajectories:
    """Everything assembly found in one rollout: the trajectories and what was left out."""

    rollout: RolloutView
    trajectories: list[Trajectory]
    faithfulness: Faithfulness
    skipped: list[Skipped]
    text_only: list[str]
    seqs: dict[str, int]
    """Each call's seq, to show calls the way `rolltap show` numbers them."""
    n_calls: int


async def build(
    db: Database,
    rollouts: Sequence[RolloutView],
    detokenizer: Detokenizer | None = None,
    *,
    lines: bool = True,
) -> list[RolloutTrajectories]:
    """Assemble and classify a few rollouts at once (a handful of queries for all of them).
    `lines`: one-line rollouts straight from their rows (analysis/lines.py); False sends every
    rollout through assembly, which yields the same."""
    ids = [r.id for r in rollouts]
    async with db.connect() as conn:
        call_rows, choices = await _load_rows(conn, ids)
        routing = await routed.load(conn, ids)
    by_rollout: dict[str, list[Row]] = {}
    for row in call_rows:
        by_rollout.setdefault(row[1], []).append(row)
    straight: dict[str, Line] = {}
    if lines:
        for rid, rows in by_rollout.items():
            line = line_of(rows, choices)
            if line is not None:
                straight[rid] = line
    rest = [row for rid, rows in by_rollout.items() if rid not in straight for row in rows]
    calls, meta = _calls(rest, choices)
    assemblies = {rid: assemble(calls.get(rid, [])) for rid in ids if rid not in straight}
    sites = {rid: break_sites(a) for rid, a in assemblies.items()}
    wanted = {c for found in sites.values() for site in found for c in calls_to_read(site)}
    messages: dict[str, CallMessages] = {}
    if wanted:
        async with db.connect() as conn:
            messages = await _load_messages(conn, wanted, meta)
    built: list[RolloutTrajectories] = []
    for r in rollouts:
        if r.id in straight:
            built.append(_line_trajectories(r, straight[r.id], routing))
            continue
        drifts = await classify_all(sites[r.id], messages, detokenizer)
        by_segment = {s.segment: d for s, d in zip(sites[r.id], drifts, strict=True)}
        built.append(_rollout_trajectories(r, assemblies[r.id], by_segment, meta, routing))
    return built


@dataclass(frozen=True)
class _CallMeta:
    seq: int
    dialect: CallDialect
    weight_version: str | None
    weight_spans: dict[str, Any] | None = None


async def _load_rows(
    conn: AsyncConnection, rollout_ids: Sequence[str]
) -> tuple[Sequence[Row], dict[str, list[Row]]]:
    """The rollouts' call rows in seq order, and each call's choice rows in index order."""
    call_rows = (
        await conn.execute(
            select(*CALL_COLUMNS)
            .where(C.c.rollout_id.in_(rollout_ids))
            .order_by(C.c.rollout_id, C.c.seq)
        )
    ).all()
    choice_rows = (
        await conn.execute(
            select(*CHOICE_COLUMNS)
            .join(C, C.c.id == CH.c.call_id)
            .where(C.c.rollout_id.in_(rollout_ids))
            # The order both tables' keys give (rollout, seq; call, index): by call id alone,
            # SQLite sorted every row, blobs and all, in a temporary B-tree.
            .order_by(C.c.rollout_id, C.c.seq, CH.c.idx)
        )
    ).all()
    choices: dict[str, list[Row]] = {}
    for row in choice_rows:
        choices.setdefault(row[0], []).append(row)
    return call_rows, choices


def _calls(
    call_rows: Sequence[Row], choice_rows: Mapping[str, Sequence[Row]]
) -> tuple[dict[str, list[CallInput]], dict[str, _CallMeta]]:
    """Call rows (lines.CALL_COLUMNS) as assembly's inputs, their prompts rebuilt."""
    choices: dict[str, list[ChoiceTokens]] = {}
    completions: dict[tuple[str, int], IdArray] = {}
    for call_id, *_ in call_rows:
        for _, idx, finish, ids_blob, lp_blob in choice_rows.get(call_id, ()):
            ids = unpack_ids(ids_blob)
            completions[(call_id, idx)] = ids
            choices.setdefault(call_id, []).append(
                ChoiceTokens(idx, ids, unpack_logprobs(lp_blob), finish)
            )
    stored = [
        StoredPrompt(call_id, parent, choice, shared, unpack_ids(suffix))
        for call_id, *_, parent, choice, shared, suffix, _spans in call_rows
    ]
    prompts = rebuild_prompts(stored, completions)
    calls: dict[str, list[CallInput]] = {}
    meta: dict[str, _CallMeta] = {}
    for (
        call_id,
        rollout_id,
        seq,
        dialect,
        purpose,
        status,
        capture,
        retry_of,
        retry_count,
        body_hash,
        weight_version,
        parent,
        parent_choice,
        shared,
        suffix,
        weight_spans,
    ) in call_rows:
        has_prompt = suffix is not None or parent is not None
        calls.setdefault(rollout_id, []).append(
            CallInput(
                id=call_id,
                seq=seq,
                status=_STATUS[status],
                capture=_CAPTURE[capture],
                purpose=purpose,
                retry_of=retry_of,
                retry_count=retry_count or 0,
                body_hash=body_hash,
                prompt=prompts[call_id] if has_prompt else None,
                choices=tuple(choices.get(call_id, ())),
                stored_parent=None if parent is None else (parent, parent_choice, shared),
            )
        )
        meta[call_id] = _CallMeta(seq, _DIALECT[dialect], weight_version, weight_spans)
    return calls, meta


async def _load_messages(
    conn: AsyncConnection, call_ids: set[str], meta: dict[str, _CallMeta]
) -> dict[str, CallMessages]:
    rows = await conn.execute(
        select(B.c.call_id, B.c.request, B.c.response).where(B.c.call_id.in_(sorted(call_ids)))
    )
    return {
        call_id: CallMessages(
            meta[call_id].dialect, compress.inflate(request), compress.inflate(response)
        )
        for call_id, request, response in rows
    }


def _rollout_trajectories(
    rollout: RolloutView,
    assembly: Assembly,
    drifts: dict[int, Drift],
    meta: dict[str, _CallMeta],
    routing: dict[routed.Key, routed.StoredRouting] | None = None,
) -> RolloutTrajectories:
    arrays = [segment.arrays() for segment in assembly.segments]
    sampled = sum(int(a.mask.sum()) for a in arrays)
    lost = sum(a.lost_tokens for a in arrays)
    roles = Counter(s.role for s in assembly.segments)
    faithfulness = Faithfulness(
        sampled_tokens=sampled,
        lost_tokens=lost,
        breaks=dict(Counter(d.kind.value for d in drifts.values())),
        segments=len(assembly.segments),
        side_calls=roles[SegmentRole.SIDE],
        siblings=roles[SegmentRole.SIBLING],
        text_only_calls=len(assembly.text_only),
        skipped_calls=len(assembly.skipped),
    )
    trajectories = []
    for segment, a in zip(assembly.segments, arrays, strict=True):
        link = segment.link
        drift = drifts.get(segment.index)
        last = segment.pieces[-1]
        trajectories.append(
            _trajectory(
                rollout,
                segment.index,
                segment.role,
                tuple(segment.calls),
                tuple(meta[c].weight_version for c in segment.calls),
                tuple(choice_spans(meta[p.call.id].weight_spans, p.choice) for p in segment.pieces),
                last.sampled.finish_reason,
                None
                if link is None
                else SegmentLink(
                    link.kind, link.parent_segment, link.call_id, link.choice, link.position, drift
                ),
                (last.call.id, last.choice),
                a,
                faithfulness.share,
                routing or {},
                len(assembly.segments),
            )
        )
    seqs = {cid: meta[cid].seq for cid in _call_ids(assembly)}
    return RolloutTrajectories(
        rollout,
        trajectories,
        faithfulness,
        assembly.skipped,
        assembly.text_only,
        seqs,
        len(seqs),
    )


def _line_trajectories(
    rollout: RolloutView, line: Line, routing: dict[routed.Key, routed.StoredRouting]
) -> RolloutTrajectories:
    """What _rollout_trajectories makes of a one-line rollout's one segment."""
    arrays = line.arrays
    sampled = int(arrays.mask.sum())
    faithfulness = Faithfulness(sampled, 0, {}, 1, 0, 0, 0, 0)
    main = _trajectory(
        rollout,
        0,
        SegmentRole.MAIN,
        line.call_ids,
        line.weight_versions,
        line.weight_spans,
        line.finish_reason,
        None,
        (line.call_ids[-1], line.last_choice),
        arrays,
        faithfulness.share,
        routing,
        1,
    )
    seqs = dict(zip(line.call_ids, line.seqs, strict=True))
    return RolloutTrajectories(rollout, [main], faithfulness, [], [], seqs, len(seqs))


def replay_of(meta: Mapping[str, Any]) -> str | None:
    """The rollout a replay rollout replays (`meta["replay_of"]`, audit/replay.py), else None."""
    found = meta.get(REPLAY_OF)
    return found if isinstance(found, str) else None


def _call_ids(assembly: Assembly) -> set[str]:
    ids = {p.call.id for s in assembly.segments for p in s.pieces}
    return ids | {s.call_id for s in assembly.skipped} | set(assembly.text_only)


def _trajectory(
    rollout: RolloutView,
    segment: int,
    role: SegmentRole,
    call_ids: tuple[str, ...],
    versions: tuple[str | None, ...],
    call_spans: tuple[list[list[Any]] | None, ...],
    finish_reason: str | None,
    link: SegmentLink | None,
    last: routed.Key,
    arrays: SegmentArrays,
    share: float,
    routing: dict[routed.Key, routed.StoredRouting],
    n_segments: int,
) -> Trajectory:
    n = arrays.prompt_len
    return Trajectory(
        rollout_id=rollout.id,
        segment=segment,
        role=role,
        prompt_ids=arrays.ids[:n],
        response_ids=arrays.ids[n:],
        loss_mask=arrays.mask[n:],
        logprobs=arrays.logprobs[n:],
        reward=rollout.reward,
        status=rollout.status,
        batch_id=rollout.batch_id,
        task_id=rollout.task_id,
        sample_index=rollout.sample_index,
        call_ids=call_ids,
        weight_versions=versions,
        prompt_hash=token_hash(arrays.ids[:n]),
        finish_reason=finish_reason,
        link=link,
        sampled_tokens=int(arrays.mask.sum()),
        lost_tokens=arrays.lost_tokens,
        has_logprobs=arrays.has_logprobs,
        rollout_faithfulness=share,
        head_hash=rollout.head_hash,
        n_segments=n_segments,
        replay_of=replay_of(rollout.meta),
        routed_experts=routed.for_sequence(routing, last, len(arrays.ids)),
        hack_flags=hacks.detectors_of(rollout.hack_flags),
        _answers=tuple((start - n, end - n) for start, end in arrays.answers),
        _call_spans=call_spans if any(call_spans) else (),
    )


def record(conn: Connection, built: RolloutTrajectories) -> None:
    """Store a rollout's breaks and faithfulness summary, replacing an earlier analysis (inside
    the caller's transaction: the store runs it on its one writer)."""
    rid = built.rollout.id
    rows = [
        {
            "call_id": t.call_ids[0],
            "rollout_id": rid,
            "segment": t.segment,
            "kind": t.link.kind.value,
            "drift": None if t.link.drift is None else t.link.drift.kind.value,
            "parent_call_id": t.link.call_id,
            "parent_choice": t.link.choice,
            "position": t.link.position,
            "detail": None if t.link.drift is None else t.link.drift.as_dict(),
        }
        for t in built.trajectories
        if t.link is not None and t.link.kind is not LinkKind.SIBLING
    ]
    f = built.faithfulness
    summary = {
        "rollout_id": rid,
        "analyzed_at": datetime.now(UTC),
        "calls": built.n_calls,
        "segments": f.segments,
        "sampled_tokens": f.sampled_tokens,
        "lost_tokens": f.lost_tokens,
        "share": f.share,
        "breaks": f.breaks,
        "side_calls": f.side_calls,
        "text_only_calls": f.text_only_calls,
        "skipped_calls": f.skipped_calls,
    }
    conn.execute(delete(SB).where(SB.c.rollout_id == rid))
    conn.execute(delete(RF).where(RF.c.rollout_id == rid))
    if rows:
        conn.execute(insert(SB), rows)
    conn.execute(insert(RF), [summary])
