"""The `think` reasoning parser on whole and streamed output."""

from __future__ import annotations

import pytest

from rolltap.chatformat.reasoning import ReasoningStream, prompt_opens_reasoning, split_reasoning


@pytest.mark.parametrize(
    ("text", "opened", "reasoning", "content"),
    [
        ("<think>2+2 is 4.</think>4", False, "2+2 is 4.", "4"),
        ("\n<think>hm</think>\n\nAnswer", False, "hm", "\n\nAnswer"),
        ("2+2 is 4.</think>4", True, "2+2 is 4.", "4"),
        ("still thinking", True, "still thinking", None),
        ("<think>never closed", False, "never closed", None),
        ("plain answer", False, None, "plain answer"),
        ("plain </think> answer", False, None, "plain </think> answer"),
        ("<think></think>x", False, None, "x"),
        ("", True, None, None),
        ("<thin", False, None, "<thin"),
    ],
)
def test_split_reasoning(
    text: str, opened: bool, reasoning: str | None, content: str | None
) -> None:
    assert split_reasoning(text, opened) == (reasoning, content)


@pytest.mark.parametrize("size", [1, 2, 5])
@pytest.mark.parametrize("opened", [True, False])
def test_streamed_split_equals_whole_split(size: int, opened: bool) -> None:
    text = "<think>step one </thi then </think>final </think> answer"
    stream = ReasoningStream(opened)
    reasoning = content = ""
    for i in range(0, len(text), size):
        r, c = stream.push(text[i : i + size])
        reasoning, content = reasoning + r, content + c
    r, c = stream.finish()
    assert ((reasoning + r) or None, (content + c) or None) == split_reasoning(text, opened)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("<|im_start|>assistant\n<think>\n", True),
        ("<|im_start|>assistant\n<think>", True),
        ("<|im_start|>assistant\n", False),
        ("<think>x</think>\n<|im_start|>assistant\n", False),
    ],
)
def test_prompt_opens_reasoning(prompt: str, expected: bool) -> None:
    assert prompt_opens_reasoning(prompt) is expected
