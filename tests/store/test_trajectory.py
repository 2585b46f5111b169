"""Trajectories from real calls: real SmolLM2 ids of real chat-templated conversations, stored in
a real SQLite file and a real PostgreSQL database."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import select

import rolltap.store
from rolltap.analysis import reader as blocking
from rolltap.analysis.reading import analyze_rollout, rollout_trajectories, trajectories
from rolltap.analysis.segments import SegmentRole
from rolltap.analysis.trajectory import RolloutTrajectories
from rolltap.store import CallStatus, Capture, NewRollout, Store
from rolltap.store.events import Declared
from rolltap.store.models import DriftClass, LinkKind, segment_break_table
from tests.support.chats import Recorder, Renderer, smollm2_tokenizer

SYSTEM = {"role": "system", "content": "You are a careful assistant. Use tools when needed."}


@pytest.fixture(scope="session")
def smollm2() -> Renderer:
    return Renderer(smollm2_tokenizer())


async def _recorder(store: Store, renderer: Renderer, **fields: object) -> Recorder:
    created = await store.create_rollout(NewRollout(**fields))  # type: ignore[arg-type]
    return Recorder(store, created.id, renderer)


async def assert_token_exact(store: Store, built: RolloutTrajectories) -> None:
    """Each trajectory reproduces every merged call's prompt + completion and its logprobs."""
    for t in built.trajectories:
        full = np.concatenate([t.prompt_ids, t.response_ids])
        mask = np.concatenate([np.zeros(len(t.prompt_ids), np.int8), t.loss_mask])
        logprobs = np.concatenate([np.zeros(len(t.prompt_ids), np.float32), t.logprobs])
        covered = np.zeros(len(full), dtype=bool)
        for call_id in t.call_ids:
            tokens = await store.call_tokens(call_id)
            start = len(tokens.prompt_ids)
            assert np.array_equal(full[:start], tokens.prompt_ids)
            matching = [
                c
                for c in tokens.choices
                if np.array_equal(full[start : start + len(c.token_ids)], c.token_ids)
            ]
            assert matching, "the segment holds none of the call's choices"
            end = start + len(matching[0].token_ids)
            assert mask[start:end].all()
            assert np.array_equal(logprobs[start:end], matching[0].logprobs)
            covered[start:end] = True
        assert np.array_equal(mask == 1, covered)
        assert (logprobs[~covered] == 0).all()


async def test_clean_multi_turn_chain_is_one_segment(store: Store, smollm2: Renderer) -> None:
    rec = await _recorder(store, smollm2, task_id="weather", sample_index=0)
    messages = [SYSTEM, {"role": "user", "content": "What is 17 + 25?"}]
    ids, answer = rec.answer("Let me compute that: 17 + 25 = 42.")
    await rec.call(messages, (ids, answer))
    messages += [
        {"role": "assistant", **answer},
        {"role": "user", "content": "And doubled?"},
    ]
    ids, answer = rec.answer("Doubled, it is 84.")
    await rec.call(messages, (ids, answer))
    messages += [{"role": "assistant", **answer}, {"role": "user", "content": "Thanks!"}]
    ids, answer = rec.answer("You're welcome.")
    await rec.call(messages, (ids, answer))

    built = await rollout_trajectories(store, rec.rollout_id)

    assert len(built.trajectories) == 1
    (t,) = built.trajectories
    assert t.role is SegmentRole.MAIN
    assert t.link is None
    assert len(t.call_ids) == 3
    assert t.prompt_ids.dtype == np.int32
    assert t.loss_mask.dtype == np.int8
    assert t.logprobs.dtype == np.float32
    assert len(t.response_ids) == len(t.loss_mask) == len(t.logprobs)
    assert t.prompt_ids.tolist() == rec.prompt(messages[:2])
    assert t.sampled_tokens == sum(
        len(smollm2.ids(x + "<|im_end|>"))
        for x in ("Let me compute that: 17 + 25 = 42.", "Doubled, it is 84.", "You're welcome.")
    )
    assert built.faithfulness.share == 1.0
    assert built.faithfulness.breaks == {}
    await assert_token_exact(store, built)


async def test_retokenized_answer_breaks_the_chain(store: Store, smollm2: Renderer) -> None:
    rec = await _recorder(store, smollm2)
    messages = [SYSTEM, {"role": "user", "content": "Shout the word having."}]
    text = "HAVING"
    canonical = smollm2.ids(text)
    odd = smollm2.ids("H") + smollm2.ids("AVING")
    assert smollm2.decode(odd) == text
    assert odd != canonical
    end = smollm2.ids("<|im_end|>")
    await rec.call(messages, (odd + end, {"content": text}))
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Again."}]
    first_prompt = rec.prompt(messages[:2])
    ids, answer = rec.answer("HAVING!")
    await rec.call(messages, (ids, answer))
    messages += [{"role": "assistant", **answer}, {"role": "user", "content": "Once more."}]
    await rec.call(messages, rec.answer("HAVING!!"))

    built = await rollout_trajectories(store, rec.rollout_id)

    assert [t.role for t in built.trajectories] == [SegmentRole.MAIN, SegmentRole.MAIN]
    broken = built.trajectories[1]
    assert broken.link is not None
    assert broken.link.kind is LinkKind.BREAK
    assert broken.link.position == len(first_prompt)
    assert broken.link.drift is not None
    assert broken.link.drift.kind is DriftClass.RETOKENIZATION
    assert broken.link.drift.region == "sampled"
    assert built.faithfulness.breaks == {"retokenization": 1}
    assert built.trajectories[0].lost_tokens == len(odd + end)
    assert built.faithfulness.share < 1.0
    await assert_token_exact(store, built)


async def test_side_calls_are_linked_segments_of_their_own(store: Store, smollm2: Renderer) -> None:
    rec = await _recorder(store, smollm2)
    messages = [SYSTEM, {"role": "user", "content": "Plan a trip to Rome."}]
    ids, answer = rec.answer("Day one: the Colosseum.")
    await rec.call(messages, (ids, answer))
    title = [
        {"role": "system", "content": "Write a five-word title for this chat."},
        {"role": "user", "content": "Plan a trip to Rome."},
    ]
    await rec.call(title, rec.answer("Planning a Roman holiday"), purpose="title")
    # An untagged side question: a different conversation, and the main line goes on after it.
    other = [
        {"role": "system", "content": "Classify the sentiment."},
        {"role": "user", "content": "I love Rome"},
    ]
    await rec.call(other, rec.answer("positive"))
    messages += [{"role": "assistant", **answer}, {"role": "user", "content": "Day two?"}]
    await rec.call(messages, rec.answer("Day two: the Vatican."))

    built = await rollout_trajectories(store, rec.rollout_id)

    roles = [t.role for t in built.trajectories]
    assert roles == [SegmentRole.MAIN, SegmentRole.SIDE, SegmentRole.SIDE]
    main, tagged, untagged = built.trajectories
    assert len(main.call_ids) == 2
    for side in (tagged, untagged):
        assert side.link is not None
        assert side.link.kind is LinkKind.SIDE
        assert side.link.drift is None
        assert side.link.parent_segment == 0
    assert built.faithfulness.side_calls == 2
    assert built.faithfulness.breaks == {}
    await assert_token_exact(store, built)


async def test_retries_never_become_duplicate_samples(store: Store, smollm2: Renderer) -> None:
    rec = await _recorder(store, smollm2)
    messages = [SYSTEM, {"role": "user", "content": "Name a prime."}]
    failed = await rec.call(messages, status=CallStatus.FAILED)
    first = await rec.call(messages, rec.answer("Seven."), retry_of=failed.call_id)
    # The client gave up waiting and asked again; both answers were recorded, it used the second.
    ids, answer = rec.answer("Eleven.")
    second = await rec.call(messages, (ids, answer), retry_of=first.call_id)
    messages += [{"role": "assistant", **answer}, {"role": "user", "content": "Another?"}]
    await rec.call(messages, rec.answer("Thirteen."))

    built = await rollout_trajectories(store, rec.rollout_id)

    (t,) = built.trajectories
    assert t.call_ids[0] == second.call_id
    assert {(s.call_id, s.reason) for s in built.skipped} == {
        (failed.call_id, "failed"),
        (first.call_id, "retry"),
    }
    await assert_token_exact(store, built)


async def test_n_choices_become_sibling_segments(store: Store, smollm2: Renderer) -> None:
    rec = await _recorder(store, smollm2)
    messages = [SYSTEM, {"role": "user", "content": "Pick a colour."}]
    choices = [rec.answer("Red."), rec.answer("Blue."), rec.answer("Green.")]
    receipt = await rec.call(messages, *choices)
    # The harness went on with the second choice.
    messages += [{"role": "assistant", **choices[1][1]}, {"role": "user", "content": "Why?"}]
    await rec.call(messages, rec.answer("It is calm."))

    built = await rollout_trajectories(store, rec.rollout_id)

    main, *siblings = built.trajectories
    assert main.role is SegmentRole.MAIN
    assert len(main.call_ids) == 2
    assert smollm2.decode(main.response_ids.tolist()).startswith("Blue.")
    assert [t.role for t in siblings] == [SegmentRole.SIBLING, SegmentRole.SIBLING]
    prompt = rec.prompt(messages[:2])
    texts = sorted(smollm2.decode(t.response_ids.tolist()) for t in siblings)
    assert texts == ["Green.<|im_end|>", "Red.<|im_end|>"]
    for t in siblings:
        assert t.prompt_ids.tolist() == prompt
        assert t.link is not None
        assert t.link.kind is LinkKind.SIBLING
        assert (t.link.call_id, t.link.choice) == (receipt.call_id, 1)
        assert t.loss_mask.all()
    assert built.faithfulness.siblings == 2
    await assert_token_exact(store, built)


async def test_text_only_call_breaks_the_chain_and_is_never_a_sample(
    store: Store, smollm2: Renderer
) -> None:
    rec = await _recorder(store, smollm2)
    messages = [SYSTEM, {"role": "user", "content": "Count to two."}]
    ids, answer = rec.answer("One, two.")
    await rec.call(messages, (ids, answer))
    messages += [{"role": "assistant", **answer}, {"role": "user", "content": "To three?"}]
    text_call = await rec.call(messages, rec.answer("One, two, three."), capture=Capture.TEXT)
    messages += [
        {"role": "assistant", "content": "One, two, three."},
        {"role": "user", "content": "To four?"},
    ]
    await rec.call(messages, rec.answer("One, two, three, four."))

    built = await rollout_trajectories(store, rec.rollout_id)

    assert built.text_only == [text_call.call_id]
    assert all(text_call.call_id not in t.call_ids for t in built.trajectories)
    assert len(built.trajectories) == 2
    after = built.trajectories[1].link
    assert after is not None
    assert after.kind is LinkKind.BREAK
    assert after.drift is not None
    assert after.drift.kind is DriftClass.TEXT_ONLY
    assert built.faithfulness.text_only_calls == 1
    assert built.faithfulness.share == 1.0
    await assert_token_exact(store, built)


async def test_reward_and_selection_reach_the_reader(
    store: Store, smollm2: Renderer, db_url: str
) -> None:
    wins = await _recorder(store, smollm2, batch_id="b1", task_id="t", sample_index=0)
    loses = await _recorder(store, smollm2, batch_id="b1", task_id="t", sample_index=1)
    other = await _recorder(store, smollm2, batch_id="b2", task_id="t", sample_index=0)
    for rec in (wins, loses, other):
        await rec.call([SYSTEM, {"role": "user", "content": "Say yes."}], rec.answer("Yes."))
    await store.report(wins.rollout_id, Declared("finished"), reward=1.0)
    await store.report(loses.rollout_id, Declared("failed"), reward=0.0)

    seen = [t async for t in trajectories(store, batch="b1")]
    assert {(t.rollout_id, t.reward) for t in seen} == {
        (wins.rollout_id, 1.0),
        (loses.rollout_id, 0.0),
    }
    with rolltap.store.open(db_url) as reader:
        succeeded = list(blocking.trajectories(reader, batch="b1", status="finished"))
        by_id = list(blocking.trajectories(reader, rollouts=[other.rollout_id]))
    assert [(t.rollout_id, t.reward, t.task_id, t.sample_index) for t in succeeded] == [
        (wins.rollout_id, 1.0, "t", 0)
    ]
    assert [t.rollout_id for t in by_id] == [other.rollout_id]
    assert by_id[0].reward is None


async def test_analysis_is_recorded_in_sql(store: Store, smollm2: Renderer) -> None:
    rec = await _recorder(store, smollm2)
    messages = [SYSTEM, {"role": "user", "content": "Shout having."}]
    await rec.call(
        messages, (smollm2.ids("H") + smollm2.ids("AVING<|im_end|>"), {"content": "HAVING"})
    )
    messages += [{"role": "assistant", "content": "HAVING"}, {"role": "user", "content": "Again."}]
    second = await rec.call(messages, rec.answer("HAVING"))

    built = await analyze_rollout(store, rec.rollout_id)
    again = await analyze_rollout(store, rec.rollout_id)

    assert built.faithfulness == again.faithfulness
    async with store.db.connect() as conn:
        rows = (
            await conn.execute(
                select(segment_break_table).where(
                    segment_break_table.c.rollout_id == rec.rollout_id
                )
            )
        ).all()
    assert [(r.call_id, r.kind, r.drift) for r in rows] == [
        (second.call_id, "break", "retokenization")
    ]
    assert rows[0].detail["region"] == "sampled"
