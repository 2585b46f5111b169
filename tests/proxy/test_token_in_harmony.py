"""gpt-oss answers (Harmony) read from their token ids by openai-harmony: reasoning, content
and calls, whole and one token at a time alike, and each answer's parse outcome."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rolltap.chatformat.parse import AnswerParser, Delta, parse_whole
from tests.contract import harmony_vocab

pytest.importorskip("openai_harmony", reason="openai-harmony (rolltap[harmony]) is not installed")

CALL = (
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
    "<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)
FINAL = (
    "<|channel|>analysis<|message|>Easy.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>4<|return|>"
)


@pytest.fixture(scope="module")
def ids(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[int]]:
    reason = harmony_vocab.install(Path(tmp_path_factory.mktemp("o200k")))
    if reason is not None:
        pytest.skip(reason)
    from rolltap.chatformat.harmony import encoding

    return {t: encoding().encode(t, allowed_special="all") for t in (CALL, FINAL)}


@pytest.mark.parametrize("text", [CALL, FINAL])
def test_a_harmony_answer_reads_the_same_whole_and_token_by_token(
    ids: dict[str, list[int]], text: str
) -> None:
    whole = parse_whole("", "openai_gptoss", "openai", [], ids[text])
    parser = AnswerParser("openai_gptoss", "openai", [])
    streamed = Delta()
    for token in ids[text]:
        streamed.add(parser.push("", [token]))
    streamed.add(parser.finish())
    assert (streamed.reasoning, streamed.content) == (whole.reasoning, whole.content)
    assert [(c.name, json.loads(c.arguments)) for c in streamed.calls()] == [
        (c.name, json.loads(c.arguments)) for c in whole.calls()
    ]
    if text == CALL:
        assert whole.reasoning == "Need the weather."
        assert [(c.name, json.loads(c.arguments)) for c in whole.calls()] == [
            ("get_weather", {"city": "Paris"})
        ]
        assert parser.tool_parse == "ok"
    else:
        assert (whole.reasoning, whole.content, whole.tool_calls) == ("Easy.", "4", [])
        assert parser.tool_parse == "none"


def test_a_call_with_broken_json_is_recorded_malformed(ids: dict[str, list[int]]) -> None:
    from rolltap.chatformat.harmony import encoding

    broken = CALL.replace('{"city": "Paris"}', '{"city": }')
    parser = AnswerParser(None, "openai", [], stream=False)
    parser.push("", encoding().encode(broken, allowed_special="all"))
    parser.finish()
    assert parser.tool_parse is not None
    assert parser.tool_parse.startswith("malformed: tool call 1: arguments not JSON")
