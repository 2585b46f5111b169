"""`rolltap show` names each call it talks about by its number, apart from any count: every
malformed answer on a line of its own with its call and what failed to parse, and the calls
left out of the segments as a count and, separately, as a list of calls (issue #35)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from rolltap.proxy.tokenin.options import TokenInOptions
from rolltap.store import CallStatus, NewRollout
from tests.support.cli import rolltap
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import fake_engine, new_rollout, running_proxy
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
# Two answers whose first tool call is broken, each in its own way.
NOT_JSON = '<tool_call>\n{"name": "bash", "arguments": {"command": </tool_call>'
NO_NAME = '<tool_call>\n{"arguments": {"command": "ls"}}\n</tool_call>'


async def _rollout(tmp_path: Path) -> str:
    """A token-in rollout through the real proxy and the fake engine: call 1 starts the
    conversation (the engine renders and parses it), then 2 is answered with a broken call,
    3 is refused (its body is no JSON), 4 with a call without a name, 5 with a good call."""
    replies: Iterator[Reply] = iter([Reply(text=NOT_JSON), Reply(text=NO_NAME), Reply(text=GOOD)])
    engine = FakeVLLM(
        script=lambda body: Reply(text="Sure."), completion_script=lambda prompt: next(replies)
    )
    async with (
        opened_store(f"sqlite:///{tmp_path / 's.sqlite'}") as store,
        fake_engine(engine) as served,
        running_proxy(store, served.url, token_in=TokenInOptions(enabled=True)) as proxy,
        aiohttp.ClientSession() as session,
    ):
        rollout_id, key = await new_rollout(store, task_id="t")
        url = f"{proxy.url}/r/{key}/v1/chat/completions"
        messages: list[dict[str, Any]] = [{"role": "user", "content": "List files."}]
        for k in range(4):
            if k == 2:
                async with session.post(url, data=b"{not json") as refused:
                    assert refused.status == 400
            body = {"model": "m", "messages": messages, "tools": TOOLS}
            async with session.post(url, json=body) as r:
                assert r.status == 200, await r.text()
                message = (await r.json())["choices"][0]["message"]
            messages.append({"role": "assistant", "content": message["content"]})
            messages.append({"role": "user", "content": "Go on."})
        calls = await store.calls(rollout_id)
    assert [c.status.value for c in calls] == ["ok", "ok", "rejected", "ok", "ok"]
    assert [c.seq for c in calls] == [1, 2, 3, 4, 5]
    return rollout_id


async def test_show_names_each_malformed_answer_and_each_skipped_call(tmp_path: Path) -> None:
    rollout = await _rollout(tmp_path)

    shown = rolltap(tmp_path, "show", rollout, "--db", "s.sqlite")

    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "malformed_call_rate 0.67  (ok 1, malformed 2, none 0)" in out
    malformed = [line.strip() for line in out.splitlines() if "malformed:" in line]
    # Each malformed answer by its own call's number; the number of the broken tool call
    # within the answer is said as such, not as a bare "call 1" that reads as the rollout's.
    assert len(malformed) == 2, out
    assert re.fullmatch(
        r"malformed: call 2, tool call 1: not JSON \(Expecting value: line \d+ column \d+ "
        r"\(char \d+\)\)",
        malformed[0],
    ), malformed
    assert malformed[1] == "malformed: call 4, tool call 1: no name"
    # The summary counts the skipped calls; the list names them by number.
    assert " · skipped 1 call\n" in out
    assert "  skipped (in no segment): call 3 (rejected)\n" in out
    assert "skipped calls" not in out


async def test_show_reads_old_reasons_and_lists_a_long_run_in_part(tmp_path: Path) -> None:
    """Reasons recorded before they said `tool call N` (`call 1: no name`) and reasons that
    name no tool call (harmony's) still come with their call's number; a rollout whose every
    answer is malformed lists ten and counts the rest; two calls skipped are `2 calls`."""
    async with opened_store(f"sqlite:///{tmp_path / 's.sqlite'}") as store:
        rollout = (await store.create_rollout(NewRollout(task_id="t"))).id
        outcomes = ["malformed: call 1: no name", "malformed: cut inside a message"]
        outcomes += [f"malformed: tool call 2: no name {k}" for k in range(10)]
        for k, outcome in enumerate(outcomes):
            await store.append_call(call(rollout, [1, 2, k], [4], tool_parse=outcome))
        for _ in range(2):
            await store.append_call(call(rollout, [1, 2], [], status=CallStatus.FAILED))

    shown = rolltap(tmp_path, "show", rollout, "--db", "s.sqlite")

    assert shown.returncode == 0, shown.stderr
    lines = [line.strip() for line in shown.stdout.splitlines() if "malformed" in line]
    assert lines[1:5] == [
        "malformed: call 1, tool call 1: no name",
        "malformed: call 2: cut inside a message",
        "malformed: call 3, tool call 2: no name 0",
        "malformed: call 4, tool call 2: no name 1",
    ]
    assert lines[11:] == ["and 2 more malformed answers (each call's tool_parse: --json)"]
    assert " · skipped 2 calls\n" in shown.stdout
    assert "  skipped (in no segment): call 13 (failed), call 14 (failed)\n" in shown.stdout
