"""The assembler on generated rollouts: chains, breaks, side calls, n > 1, retries, text-only."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rolltap.analysis.segments import Assembly, CallInput, SegmentRole, assemble
from rolltap.store.delta import common_prefix
from rolltap.store.models import CallStatus, Capture, LinkKind
from rolltap.store.records import ChoiceTokens

# A small vocabulary makes accidental prefix matches likely, which is what should be survived.
token = st.integers(min_value=0, max_value=12)
tokens = st.lists(token, min_size=1, max_size=6)


@dataclass
class _Rollout:
    calls: list[CallInput] = field(default_factory=list)
    failed: set[str] = field(default_factory=set)
    retries: list[tuple[str, str]] = field(default_factory=list)
    text_only: set[str] = field(default_factory=set)

    def add(self, prompt: list[int], answers: list[list[int]], **fields: object) -> CallInput:
        seq = len(self.calls) + 1
        choices = tuple(
            ChoiceTokens(
                i,
                np.asarray(ids, dtype=np.int32),
                (-(seq * 100 + i * 10 + np.arange(len(ids))) / 1000).astype(np.float32),
                "stop",
            )
            for i, ids in enumerate(answers)
        )
        call = CallInput(
            id=f"c{seq:03d}",
            seq=seq,
            prompt=np.asarray(prompt, dtype=np.int32),
            choices=choices,
            **fields,  # type: ignore[arg-type]
        )
        self.calls.append(call)
        return call


@st.composite
def rollouts(draw: st.DrawFn) -> _Rollout:
    r = _Rollout()
    tail = draw(tokens)
    for _ in range(draw(st.integers(1, 10))):
        step = draw(
            st.sampled_from(["extend", "extend", "break", "side", "n", "retry", "text", "failed"])
        )
        context = draw(st.lists(token, max_size=4))
        prompt = tail + context
        if step == "break" and len(tail) > 1:
            at = draw(st.integers(0, len(tail) - 1))
            prompt = [*tail[:at], (tail[at] + 1) % 13, *tail[at + 1 :], *context]
        if step == "side":
            purpose = draw(st.sampled_from([None, "title", "subagent"]))
            r.add(draw(tokens), [draw(tokens)], purpose=purpose)
            continue
        if step == "failed":
            r.failed.add(r.add(prompt, [], status=CallStatus.FAILED, capture=Capture.NONE).id)
            continue
        if step == "text":
            r.text_only.add(r.add(prompt, [], capture=Capture.TEXT).id)
            tail = prompt + draw(tokens)
            continue
        if step == "retry":
            body = f"body{len(r.calls)}"
            first = r.add(prompt, [draw(tokens)], body_hash=body)
            # Unlinked: the client retried while the first request was still running.
            linked = draw(st.booleans())
            retried = r.add(
                prompt,
                [draw(tokens)],
                retry_of=first.id if linked else None,
                retry_count=1,
                body_hash=body,
            )
            used = draw(st.sampled_from([first, retried]))
            r.retries.append((first.id, retried.id))
            tail = prompt + used.choices[0].token_ids.tolist()
            continue
        n = draw(st.integers(2, 3)) if step == "n" else 1
        call = r.add(prompt, [draw(tokens) for _ in range(n)])
        chosen = draw(st.integers(0, n - 1))
        tail = prompt + call.choices[chosen].token_ids.tolist()
    return r


def _check(r: _Rollout, assembly: Assembly) -> None:
    by_id = {c.id: c for c in r.calls}
    seen: set[tuple[str, int]] = set()
    for segment in assembly.segments:
        arrays = segment.arrays()
        expected_mask = np.zeros(len(arrays.ids), dtype=np.int8)
        for piece in segment.pieces:
            call = piece.call
            assert call.prompt is not None
            sampled = piece.sampled
            # Concatenating the segment's pieces reproduces the call's prompt + completion.
            assert np.array_equal(
                arrays.ids[: piece.end], np.concatenate([call.prompt, sampled.token_ids])
            )
            expected_mask[piece.start : piece.end] = 1
            # Every mask-1 position has the engine's logprob for that very token.
            assert np.array_equal(arrays.logprobs[piece.start : piece.end], sampled.logprobs)
            key = (call.id, piece.choice)
            assert key not in seen, "a sample appears twice"
            seen.add(key)
        assert np.array_equal(arrays.mask, expected_mask)
        assert (arrays.logprobs[arrays.mask == 0] == 0).all()
        assert arrays.prompt_len == segment.pieces[0].start
        link = segment.link
        if link is not None:
            parent = assembly.segments[link.parent_segment]
            first = segment.pieces[0].call
            assert first.prompt is not None
            if link.kind is LinkKind.SIBLING:
                assert segment.role is SegmentRole.SIBLING
                assert link.call_id == first.id
                continue
            upto = assembly.piece_of(parent.index, link.call_id)
            sequence = parent.sequence(upto)
            assert link.position == common_prefix(first.prompt, sequence)
            if link.kind is LinkKind.BREAK and parent.closed_by is None:
                # A break really is one: the parent's sequence is not a prefix of the prompt.
                assert link.position < len(sequence)
    reasons = {s.call_id: s.reason for s in assembly.skipped}
    superseded = set()
    for pair in r.retries:
        # Exactly one answer of a retried request is kept: never a duplicate sample.
        assert sorted(reasons.get(c, "") for c in pair) == ["", "retry"]
        superseded |= {c for c in pair if c in reasons}
    kept = {
        (c.id, ch.index)
        for c in r.calls
        if c.id not in r.failed | superseded | r.text_only
        for ch in c.choices
    }
    assert seen == kept
    assert set(assembly.text_only) == r.text_only
    assert set(reasons) == r.failed | superseded
    assert all(by_id[s].status is CallStatus.FAILED for s in r.failed)


@settings(max_examples=300, deadline=None)
@given(rollouts())
def test_segments_reproduce_every_call_exactly(r: _Rollout) -> None:
    _check(r, assemble(r.calls))


@settings(max_examples=100, deadline=None)
@given(rollouts())
def test_assembly_does_not_depend_on_input_order(r: _Rollout) -> None:
    forward = assemble(r.calls)
    backward = assemble(list(reversed(r.calls)))
    assert [s.calls for s in forward.segments] == [s.calls for s in backward.segments]


def test_a_clean_chain_is_one_segment() -> None:
    r = _Rollout()
    a = r.add([1, 2], [[3, 4]])
    b = r.add([1, 2, 3, 4, 5], [[6]])
    r.add([1, 2, 3, 4, 5, 6, 7, 8], [[9, 10]])
    (segment,) = assemble(r.calls).segments
    arrays = segment.arrays()
    assert arrays.ids.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert arrays.mask.tolist() == [0, 0, 1, 1, 0, 1, 0, 0, 1, 1]
    assert segment.calls == [a.id, b.id, "c003"]


def test_the_stored_delta_proves_an_extension_without_comparing() -> None:
    r = _Rollout()
    a = r.add([1, 2], [[3]])
    # The store recorded that this prompt extends call a's choice 0 over all 3 tokens.
    r.calls.append(
        CallInput(
            "c002",
            2,
            prompt=np.asarray([1, 2, 3, 4], dtype=np.int32),
            choices=(ChoiceTokens(0, np.asarray([5], dtype=np.int32), None, "stop"),),
            stored_parent=(a.id, 0, 3),
        )
    )
    (segment,) = assemble(r.calls).segments
    arrays = segment.arrays()
    assert not arrays.has_logprobs
    assert np.isnan(arrays.logprobs[-1])


def test_a_break_loses_the_tokens_after_it() -> None:
    r = _Rollout()
    r.add([1, 2], [[3, 4, 5]])
    r.add([1, 2, 3, 9, 5, 6], [[7]])  # token 4, sampled, came back as 9
    r.add([1, 2, 3, 9, 5, 6, 7, 8], [[1]])
    first, second = assemble(r.calls).segments
    assert second.link is not None
    assert second.link.kind is LinkKind.BREAK
    assert second.link.position == 3
    assert first.arrays().lost_tokens == 2
