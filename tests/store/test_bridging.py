"""bridge_break_rate: which token-in outcomes break a conversation's chain."""

from __future__ import annotations

from rolltap.analysis.bridging import Bridging


def test_first_turns_and_dropped_answers_start_chains_the_rest_break_them() -> None:
    outcomes = ["first_turn", "answer_dropped", "answer_dropped", "bridged", "history_edited", None]
    bridging = Bridging.of(outcomes)
    assert bridging is not None
    assert bridging.outcomes == {
        "first_turn": 1,
        "answer_dropped": 2,
        "bridged": 1,
        "history_edited": 1,
    }
    # One break among the two calls that continued a conversation.
    assert bridging.bridge_break_rate == 0.5
    assert bridging.as_dict()["calls"] == 5


def test_no_continuing_call_has_no_rate_and_normal_mode_has_no_record() -> None:
    only_new = Bridging.of(["first_turn", "answer_dropped"])
    assert only_new is not None
    assert only_new.bridge_break_rate is None
    assert Bridging.of([None, None]) is None
