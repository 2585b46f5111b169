"""Where each call's tokens lie in its segment: spans, lost tokens and break marks agree with
what the store recorded for every call."""

from __future__ import annotations

import numpy as np

from rolltap.analysis.reading import rollout_trajectories
from rolltap.store import CallStatus
from rolltap.ui.layout import Span, lay_out
from rolltap.ui.tokens import PAGE, window
from tests.support.audit_rollouts import Made
from tests.support.stores import opened_store


async def test_spans_hold_exactly_each_calls_tokens(fake_store: tuple[str, Made]) -> None:
    url, made = fake_store
    async with opened_store(url, read_only=True) as store:
        for rollout_id in (made.chat, made.responses, made.messages):
            calls = await store.calls(rollout_id)
            built = await rollout_trajectories(store, rollout_id)
            layout = lay_out(built, {c.id: c.prompt_tokens for c in calls})
            for call in calls:
                span = layout.span(call.id)
                if call.status is CallStatus.REJECTED:
                    assert span is None  # refused: nothing was sampled
                    continue
                assert span is not None
                recorded = await store.call_tokens(call.id)
                segment = layout.segments[span.segment]
                assert np.array_equal(segment.ids[: span.start], recorded.prompt_ids)
                sampled = segment.ids[span.start : span.end]
                assert np.array_equal(sampled, recorded.choices[0].token_ids)
                assert segment.mask[span.start : span.end].all()
                assert not segment.mask[span.context_start : span.start].any()
            for t in built.trajectories:
                assert int(layout.segments[t.segment].lost.sum()) == t.lost_tokens

        chat = await rollout_trajectories(store, made.chat)
        layout = lay_out(chat, {c.id: c.prompt_tokens for c in await store.calls(made.chat)})
        (broken,) = [t for t in chat.trajectories if t.link is not None]
        assert broken.link is not None
        (mark,) = layout.segments[0].marks
        assert (mark.position, mark.segment, mark.kind) == (
            broken.link.position,
            broken.segment,
            "history_edited",
        )
        # The broken segment's first strip starts where it left its parent.
        first = layout.span(broken.call_ids[0])
        assert first is not None
        assert first.context_start == broken.link.position


def test_windows() -> None:
    span = Span(0, "c", context_start=100, start=1_000, end=1_200)
    assert window(span) == (744, 1_200)  # the answer and the context just before it
    assert window(span, 0, 50) == (100, 100)  # clamped to the call's own tokens
    assert window(span, None, 744) == (100, 744)
    long = Span(0, "c", context_start=0, start=10, end=10 + 3 * PAGE)
    lo, hi = window(long)
    assert (lo, hi - lo) == (0, PAGE)
    assert window(long, hi) == (hi, hi + PAGE)
