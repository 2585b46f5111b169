"""Each answer records whether its tool calls parsed (`ok`, `malformed: <reason>`, `none`),
in token-in mode and on the built-in engine, and a rollout's malformed_call_rate is in the
store, `rolltap show`, the trajectory API, a batch's status and /metrics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from rolltap.analysis import outcomes as outcome_counts
from rolltap.analysis.toolparse import ToolParsing
from rolltap.audit.integrity import verify_rollout
from rolltap.chatformat.parse import AnswerParser, parse_whole
from rolltap.chatformat.tools import ToolCallStream
from rolltap.cli.main import cli
from rolltap.engine.choices import ChatChoice
from rolltap.engine.generation import TokenEvent
from rolltap.proxy.tokenin.options import TokenInOptions
from rolltap.store import NewRollout, Store
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import OpenAIFactory, fake_engine, new_rollout, running_proxy
from tests.support.records import call
from tests.support.stores import opened_store

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
GOOD = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
BROKEN = '<tool_call>\n{"name": "bash", "arguments": {"command": </tool_call>'


@pytest.mark.parametrize(
    ("parser", "text", "outcome"),
    [
        ("hermes", "Just text.", "none"),
        ("hermes", GOOD, "ok"),
        ("hermes", f"{GOOD}{BROKEN}", "malformed: tool call 2: not JSON (Expecting value:"),
        ("hermes", GOOD[:40], "malformed: tool call 1: cut before </tool_call>: not JSON"),
        ("qwen3_coder", "<tool_call><function=bash></function></tool_call>", "ok"),
        (
            "qwen3_coder",
            "<tool_call><parameter=x>1</parameter></tool_call>",
            "malformed: tool call 1: no <function=NAME>",
        ),
        ("llama3_json", '{"name": "bash", "parameters": {}}', "ok"),
        ("llama3_json", '{"name": "bash", "parameters": []}', "malformed: tool call 1: parameters"),
        ("mistral", '[TOOL_CALLS][{"name": "bash", "arguments": {}}]', "ok"),
        ("mistral", "[TOOL_CALLS]nope", "malformed: tool call 1: not NAME[ARGS]"),
        ("mistral", "No call.", "none"),
    ],
)
def test_each_parser_says_whether_the_calls_parsed(parser: str, text: str, outcome: str) -> None:
    whole = AnswerParser(None, parser, TOOLS, stream=False)
    whole.push(text)
    whole.finish()
    streamed = AnswerParser(None, parser, TOOLS, stream=True)
    for ch in text:
        streamed.push(ch)
    streamed.finish()
    assert whole.tool_parse is not None
    assert whole.tool_parse.startswith(outcome)
    assert streamed.tool_parse == whole.tool_parse
    assert parse_whole(text, None, None, None).tool_calls == []  # no tools: nothing parsed


def test_the_builtin_engine_reports_the_outcome_beside_finish_reason() -> None:
    choice = ChatChoice(
        0, lambda i: "", logprobs=False, as_ids=False, reasoning=None, tools=ToolCallStream()
    )
    for k, piece in enumerate([GOOD, BROKEN]):
        choice.feed(TokenEvent(0, k, -0.1, (), piece, "stop" if k else None))
    assert choice.tool_parse is not None
    assert choice.tool_parse.startswith("malformed: tool call 2: not JSON")
    assert [c.name for c in choice.message.tool_calls] == ["bash"]
    no_tools = ChatChoice(0, lambda i: "", logprobs=False, as_ids=False, reasoning=None, tools=None)
    assert no_tools.tool_parse is None


def test_the_rate_is_malformed_answers_over_answers_that_wrote_calls() -> None:
    parsing = ToolParsing.of(["ok", "none", "malformed: tool call 1: no name", "ok", None])
    assert parsing is not None
    assert (parsing.ok, parsing.malformed, parsing.none) == (2, 1, 1)
    assert parsing.malformed_call_rate == pytest.approx(1 / 3)
    assert parsing.as_dict()["reasons"] == ["tool call 1: no name"]
    # Recorded before reasons said `tool call N`: read as if they did.
    old = ToolParsing.of(["malformed: call 2: not JSON (x)", "malformed: cut inside a message"])
    assert old is not None
    assert old.reasons == ("tool call 2: not JSON (x)", "cut inside a message")
    assert ToolParsing.of([None]) is None
    none_wrote = ToolParsing.of(["none"])
    assert none_wrote is not None
    assert none_wrote.malformed_call_rate is None


async def test_token_in_records_each_answers_outcome_and_shows_the_rate(
    store: Store, sdk: OpenAIFactory
) -> None:
    """The first turn is rendered (vLLM parses it: nothing recorded); token-in answers are
    parsed by rolltap: a malformed call, then a good one, then text. The client sees the
    chat answer vLLM would send, without the outcome."""
    replies: Iterator[Reply] = iter([Reply(text=BROKEN), Reply(text=GOOD), Reply(text="Done.")])
    engine = FakeVLLM(
        script=lambda body: Reply(text="Sure."), completion_script=lambda prompt: next(replies)
    )
    async with (
        fake_engine(engine) as served,
        running_proxy(store, served.url, token_in=TokenInOptions(enabled=True)) as proxy,
    ):
        rollout_id, key = await new_rollout(store, task_id="t")
        client = sdk(f"{proxy.url}/r/{key}/v1")
        messages: list[dict[str, Any]] = [{"role": "user", "content": "List files."}]
        for k in range(4):
            stream = k == 2
            params: dict[str, Any] = {"model": "m", "messages": messages, "tools": TOOLS}
            if stream:
                raw = await client.chat.completions.with_raw_response.create(**params, stream=True)
                text = (await raw.http_response.aread()).decode()
                assert "tool_parse" not in text
                message: dict[str, Any] = {"role": "assistant", "content": None}
                message["tool_calls"] = [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
                ]  # fmt: skip
            else:
                raw = await client.chat.completions.with_raw_response.create(**params)
                assert "tool_parse" not in (await raw.http_response.aread()).decode()
                reply = raw.parse().choices[0].message
                message = reply.model_dump(exclude_none=True)
            messages.append(message)
            if message.get("tool_calls"):
                messages.append({"role": "tool", "tool_call_id": "call_1", "content": "a b"})
            else:
                messages.append({"role": "user", "content": "Go on."})
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{proxy.url}/admin/rollouts/{rollout_id}/trajectory") as r:
                document = await r.json()
            async with session.get(f"{proxy.url}/metrics") as r:
                metrics = await r.text()

    calls = await store.calls(rollout_id)
    assert [c.bridge for c in calls] == ["first_turn", "bridged", "bridged", "bridged"]
    outcomes = [c.tool_parse for c in calls]
    assert outcomes[0] is None
    assert outcomes[1] is not None
    assert outcomes[1].startswith("malformed: tool call 1: not JSON")
    assert outcomes[2:] == ["ok", "none"]
    assert calls[1].as_dict()["tool_parse"] == outcomes[1]
    parsing = await outcome_counts.tool_parsing(store, rollout_id=rollout_id)
    assert parsing is not None
    assert parsing.malformed_call_rate == 0.5
    assert document["tool_parsing"]["malformed_call_rate"] == 0.5
    assert document["tool_parsing"]["malformed"] == 1
    assert 'rolltap_tool_parse_total{outcome="malformed"} 1.0' in metrics
    assert 'rolltap_tool_parse_total{outcome="ok"} 1.0' in metrics
    assert "rolltap_malformed_call_rate 0.5" in metrics
    assert (await verify_rollout(store, rollout_id)).ok  # the outcome is in the chain's digest


def test_rolltap_show_prints_the_rate_and_why(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"

    async def make() -> str:
        async with opened_store(url) as store:
            rollout = (await store.create_rollout(NewRollout(task_id="t"))).id
            for k, outcome in enumerate(["ok", "malformed: call 1: no name", "none", None]):
                await store.append_call(call(rollout, [1, 2, k], [4], tool_parse=outcome))
            return rollout

    rollout = asyncio.run(make())
    shown = CliRunner().invoke(cli, ["show", rollout, "--db", url], terminal_width=200)
    document = json.loads(CliRunner().invoke(cli, ["show", rollout, "--json", "--db", url]).output)

    assert shown.exit_code == 0, shown.output
    assert "malformed_call_rate 0.50  (ok 1, malformed 1, none 1)" in shown.output
    # The answer's own call (seq 2), apart from which of its tool calls broke; the record
    # (from before reasons said `tool call N`) is kept as it was.
    assert "    malformed: call 2, tool call 1: no name\n" in shown.output
    assert [c["tool_parse"] for c in document["calls"]] == [
        "ok", "malformed: call 1: no name", "none", None
    ]  # fmt: skip


def test_the_outcome_is_in_the_digest_only_when_recorded() -> None:
    """Records from before the column keep their digests; a recorded outcome is covered."""
    from rolltap.store import chain

    row: dict[str, Any] = {name: None for name in chain.CALL_FIELDS}
    before = chain.call_digest(row, b"", [], (None, None, None))
    assert chain.call_digest({**row, "tool_parse": None}, b"", [], (None, None, None)) == before
    ok = chain.call_digest({**row, "tool_parse": "ok"}, b"", [], (None, None, None))
    none = chain.call_digest({**row, "tool_parse": "none"}, b"", [], (None, None, None))
    assert len({before, ok, none}) == 3
