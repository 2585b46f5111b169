"""Step structure of trajectories read from a real store: answer and observation spans, stable
observation hashes, and the oldest/newest weight version of a rollout that straddled an update."""

from __future__ import annotations

import numpy as np

from rolltap.analysis.reading import rollout_trajectories
from rolltap.analysis.steps import TurnKind, token_hash
from rolltap.store import NewRollout, Store
from tests.support.records import call

PROMPT = [1, 5, 6, 7, 2]
A1 = [10, 11, 12, 2]
O1 = [1, 8, 9, 2, 1]
A2 = [20, 21, 2]
O2 = [1, 30, 31, 32, 2, 1]
A3 = [40, 2]


async def _rollout(store: Store, versions: tuple[str, str, str]) -> str:
    rid = (await store.create_rollout(NewRollout(batch_id="b", task_id="t"))).id
    turn2 = PROMPT + A1 + O1
    turn3 = turn2 + A2 + O2
    for prompt, answer, version in zip((PROMPT, turn2, turn3), (A1, A2, A3), versions, strict=True):
        await store.append_call(call(rid, prompt, answer, weight_version=version))
    return rid


async def test_turns_span_every_answer_and_observation(store: Store) -> None:
    rid = await _rollout(store, ("v1", "v2", "v2"))

    (t,) = (await rollout_trajectories(store, rid)).trajectories

    kinds = [(s.kind, s.start, s.end) for s in t.turns]
    a1, o1, a2 = len(A1), len(O1), len(A2)
    assert kinds == [
        (TurnKind.ANSWER, 0, a1),
        (TurnKind.OBSERVATION, a1, a1 + o1),
        (TurnKind.ANSWER, a1 + o1, a1 + o1 + a2),
        (TurnKind.OBSERVATION, a1 + o1 + a2, a1 + o1 + a2 + len(O2)),
        (TurnKind.ANSWER, a1 + o1 + a2 + len(O2), len(t.response_ids)),
    ]
    for span in t.turns:
        mask = t.loss_mask[span.start : span.end]
        assert (mask == (1 if span.kind is TurnKind.ANSWER else 0)).all()
    answers = [s for s in t.turns if s.kind is TurnKind.ANSWER]
    assert [s.call_id for s in answers] == list(t.call_ids)
    assert [s.weight_version for s in answers] == ["v1", "v2", "v2"]
    assert t.observation_hashes == (token_hash(np.asarray(O1)), token_hash(np.asarray(O2)))
    assert t.prompt_hash == token_hash(np.asarray(PROMPT))
    assert (t.min_version, t.max_version) == ("v1", "v2")


async def test_equal_observations_hash_equal_across_rollouts(store: Store) -> None:
    first = await _rollout(store, ("1", "1", "1"))
    second = await _rollout(store, ("1", "1", "1"))

    (a,) = (await rollout_trajectories(store, first)).trajectories
    (b,) = (await rollout_trajectories(store, second)).trajectories

    assert a.observation_hashes == b.observation_hashes
    assert len(set(a.observation_hashes)) == 2
    # Fixed bytes in, fixed digest out: the hash does not depend on this process or platform.
    assert token_hash(np.asarray([1, 2, 3], dtype=np.int64)) == token_hash(
        np.asarray([1, 2, 3], dtype=np.int32)
    )
    assert len(token_hash(np.asarray([], dtype=np.int32))) == 16


async def test_a_resumed_answer_is_two_answers_with_no_observation_between(store: Store) -> None:
    """An answer aborted by a weight update and continued token-in: the continuation's prompt is
    the prompt plus the partial answer, so the two calls join one segment back to back."""
    rid = (await store.create_rollout(NewRollout())).id
    partial, rest = [10, 11], [12, 13, 2]
    await store.append_call(call(rid, PROMPT, partial, weight_version="7"))
    await store.append_call(call(rid, PROMPT + partial, rest, weight_version="8"))

    (t,) = (await rollout_trajectories(store, rid)).trajectories

    assert [(s.kind, s.start, s.end, s.weight_version) for s in t.turns] == [
        (TurnKind.ANSWER, 0, 2, "7"),
        (TurnKind.ANSWER, 2, 5, "8"),
    ]
    assert list(t.response_ids) == partial + rest
    assert (t.loss_mask == 1).all()
    assert (t.min_version, t.max_version) == ("7", "8")


async def test_versions_are_ordered_by_sampling_time_not_text(store: Store) -> None:
    rid = await _rollout(store, ("9", "10", "10"))

    (t,) = (await rollout_trajectories(store, rid)).trajectories

    assert (t.min_version, t.max_version) == ("9", "10")
