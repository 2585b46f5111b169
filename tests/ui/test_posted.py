"""How the training view merges what a trainer posted (ui/posted.py)."""

from __future__ import annotations

from typing import Any

import pytest

from rolltap.ui.posted import combine, merge_posts, shown


def test_later_posts_replace_earlier_ones_phase_by_phase() -> None:
    merged = merge_posts(
        [
            {"loss": 0.5, "seconds": {"sample": 40.0, "update": 2.0}},
            {"loss": 0.25, "seconds": {"update": 3.0, "wait": 1.0}},
        ]
    )
    assert merged == {"loss": 0.25, "seconds": {"sample": 40.0, "update": 3.0, "wait": 1.0}}


def test_batches_of_one_version_add_phases_take_the_largest_max_and_average_the_rest() -> None:
    combined = combine(
        [
            {"logprob_mismatch_max": 2e-5, "loss": 0.5, "note": "a", "seconds": {"sample": 1.0}},
            {"logprob_mismatch_max": 4e-5, "loss": 0.25, "note": "b", "seconds": {"sample": 2.0}},
        ]
    )
    assert combined == {
        "logprob_mismatch_max": 4e-5,
        "loss": pytest.approx(0.375),
        "note": "b",
        "seconds": {"sample": 3.0},
    }


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (4.056615829467773, "4.057"),
        (-0.0125, "-0.0125"),
        (3, "3"),
        (True, "true"),
        ("ckpt-3", "ckpt-3"),
        ({"sample": 31.71234, "train": 52.0}, "sample 31.71, train 52"),
    ],
)
def test_posted_figures_are_shown_to_four_digits(value: Any, text: str) -> None:
    assert shown(value) == text
