"""Incremental detokenization: deltas add up to the full decode, stop strings cut text only."""

from __future__ import annotations

from typing import Any

import pytest

from rolltap.engine.detok import TextStream

EMOJI = "héllo wörld 🐱 猫"


def run(stream: TextStream, ids: list[int]) -> list[str]:
    deltas = [stream.push(i) for i in ids]
    deltas.append(stream.finish())
    return deltas


def test_deltas_concatenate_to_the_full_decode(tokenizer: Any) -> None:
    ids = tokenizer(EMOJI)["input_ids"]
    deltas = run(TextStream(tokenizer), ids)
    assert "".join(deltas) == EMOJI == tokenizer.decode(ids)
    # a character split over three byte-level tokens is released whole, never as U+FFFD
    assert not any("\ufffd" in d for d in deltas)


def test_special_tokens_are_skipped_or_kept(tokenizer: Any) -> None:
    ids = [*tokenizer("Hi")["input_ids"], 2]
    assert "".join(run(TextStream(tokenizer), ids)) == "Hi"
    kept = TextStream(tokenizer, skip_special_tokens=False)
    assert "".join(run(kept, ids)) == "Hi<|im_end|>"


@pytest.mark.parametrize(
    ("stop", "include", "text"),
    [
        (("here",), False, "Stop "),
        (("here",), True, "Stop here"),
        ((". Th",), False, "Stop here"),  # spans three tokens
        (("zzz", " here"), False, "Stop"),
        (("more!",), False, "Stop here. Then more"),  # never matched: all text
    ],
)
def test_stop_strings(tokenizer: Any, stop: tuple[str, ...], include: bool, text: str) -> None:
    ids = tokenizer("Stop here. Then more")["input_ids"]
    stream = TextStream(tokenizer, stop, include)
    deltas = []
    consumed = 0
    for token in ids:
        deltas.append(stream.push(token))
        consumed += 1
        if stream.stopped:
            break
    deltas.append(stream.finish())
    assert "".join(deltas) == text
    if stream.stopped:
        assert stream.stopped in stop
        # the stop ends generation at the token that completed it
        assert stream.stopped in tokenizer.decode(ids[:consumed])
        assert stream.stopped not in tokenizer.decode(ids[: consumed - 1])


def test_text_that_may_become_a_stop_string_is_held_back(tokenizer: Any) -> None:
    ids = tokenizer("Stop here. Then more")["input_ids"]
    stream = TextStream(tokenizer, ("here!",))
    released = "".join(stream.push(i) for i in ids[:2])
    assert released == "Stop "  # "here" could still grow into "here!"
    assert "".join(stream.push(i) for i in ids[2:]) + stream.finish() == "here. Then more"
