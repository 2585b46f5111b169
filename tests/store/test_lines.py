"""One-line rollouts are assembled straight from their rows (analysis/lines.py): the same
trajectories, breaks and export rows as assembly gives, for every rollout that takes that path,
and every other kind of rollout left to assembly."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import numpy as np

from rolltap.analysis import trajectory
from rolltap.analysis.lines import line_of
from rolltap.export.export import arrow_table
from rolltap.store import (
    CallDialect,
    CallRecord,
    CallStatus,
    Capture,
    ChoiceRecord,
    NewRollout,
    Store,
)
from rolltap.store.events import Declared

VOCAB = 1_000


def _ids(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, VOCAB, n).astype(np.int32)


def _choice(rng: np.random.Generator, index: int = 0, *, logprobs: bool = True) -> ChoiceRecord:
    ids = _ids(rng, int(rng.integers(1, 12)))
    scores = -rng.random(len(ids)).astype(np.float32) if logprobs else None
    return ChoiceRecord(index, ids, scores, "stop")


def _record(
    rollout_id: str, prompt: np.ndarray, *choices: ChoiceRecord, **fields: object
) -> CallRecord:
    body = json.dumps({"messages": [{"role": "user", "content": "go"}]}).encode()
    return CallRecord(
        rollout_id=rollout_id,
        dialect=CallDialect.CHAT,
        status=fields.pop("status", CallStatus.OK),  # type: ignore[arg-type]
        capture=fields.pop("capture", Capture.TOKENS),  # type: ignore[arg-type]
        received_at=datetime.now(UTC),
        prompt_ids=prompt,
        choices=list(choices),
        request_body=body,
        response_body=b'{"choices": []}',
        **fields,  # type: ignore[arg-type]
    )


async def _rollout(store: Store, name: str, seed: int) -> str:
    """A rollout of a few turns, each prompt the last one's plus its answer and an observation,
    with one twist named by `name`."""
    rid = (await store.create_rollout(NewRollout(batch_id="b", task_id=name))).id
    rng = np.random.default_rng(seed)
    prompt = _ids(rng, 30)
    for turn in range(4):
        choice = _choice(rng, logprobs=not (name == "no logprobs" and turn == 2))
        fields: dict[str, object] = {"weight_version": f"v{turn // 2}"}
        if name == "side call" and turn == 2:
            side = _choice(rng)
            await store.append_call(_record(rid, _ids(rng, 20), side, purpose="title"))
        if name == "retried" and turn == 1:
            failed = await store.append_call(_record(rid, prompt, status=CallStatus.FAILED))
            fields["retry_of"] = failed.call_id
        if name == "text only" and turn == 2:
            fields["capture"] = Capture.TEXT
        if name == "two choices" and turn == 1:
            await store.append_call(_record(rid, prompt, choice, _choice(rng, 1), **fields))
        else:
            await store.append_call(_record(rid, prompt, choice, **fields))
        sequence = np.concatenate([prompt, choice.token_ids])
        if name == "broken" and turn == 1:
            sequence[-2] = (sequence[-2] + 1) % VOCAB  # the harness re-rendered the answer
        prompt = np.concatenate([sequence, _ids(rng, 7)])
        if name == "one call":
            break
    await store.report(rid, Declared("finished"), reward=0.5)
    return rid


async def test_one_line_rollouts_come_straight_from_their_rows_as_assembly_makes_them(
    store: Store,
) -> None:
    kinds = [
        "clean",
        "no logprobs",
        "one call",
        "broken",
        "side call",
        "retried",
        "text only",
        "two choices",
    ]
    ids = {await _rollout(store, kind, seed): kind for seed, kind in enumerate(kinds)}
    views = await store.rollouts(batch="b", oldest_first=True)
    async with store.db.connect() as conn:
        rows, choices = await trajectory._load_rows(conn, list(ids))

    straight = await trajectory.build(store.db, views)
    assembled = await trajectory.build(store.db, views, lines=False)

    lines = {ids[r[1]] for r in rows if line_of([c for c in rows if c[1] == r[1]], choices)}
    assert lines == {"clean", "no logprobs", "one call"}
    table = arrow_table([t for b in straight for t in b.trajectories])
    expected = arrow_table([t for b in assembled for t in b.trajectories])
    assert repr(table.to_pylist()) == repr(expected.to_pylist())  # repr: NaN equals NaN
    # One row a rollout; the break, the side call, the text-only call and the sibling add one.
    assert table.num_rows == 12
    for got, want in zip(straight, assembled, strict=True):
        assert got.faithfulness == want.faithfulness
        assert (got.seqs, got.n_calls) == (want.seqs, want.n_calls)
        assert (got.skipped, got.text_only) == (want.skipped, want.text_only)
        for t, u in zip(got.trajectories, want.trajectories, strict=True):
            assert (t.prompt_hash, t.turns) == (u.prompt_hash, u.turns)
