"""Real rollouts for the viewer's tests: harness-like clients talk to the real proxy in front of
the real SmolLM2 engine, in all three dialects, and one conversation breaks the token chain.

* `chat`: four Chat Completions turns; before the third the harness shortens an earlier answer
  of the model (as a compacting harness does), a `history_edited` break. A user turn carries
  markup, the way a hostile task or tool output would. It ends through the proxy's admin API
  as a runner ends one: succeeded, reward 1, with the verifier's and the harness's output; a
  fifth call after the end is refused.
* `responses`: two Responses turns (Codex's dialect), reward 0.
* `messages`: two Anthropic Messages turns (Claude Code's dialect), left running.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import anthropic
import openai

from rolltap.proxy.server import RunningProxy
from rolltap.store import Store
from tests.support.proxy import new_rollout, running_proxy

BATCH = "ui-batch"
HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
"""Text a hostile model or task could put in front of an auditor: it must show as text."""
VERIFIER_TAIL = "\x1b[32mPASSED\x1b[0m tests/test_answer.py::test_capital\n1 passed in 0.02s"
HARNESS_TAIL = "step 1: ask the model\nstep 2: write answer.txt\nexit 0"
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 16}


@dataclass(frozen=True)
class Made:
    chat: str
    responses: str
    messages: str


async def make_rollouts(store: Store, engine_url: str, model: str) -> Made:
    async with running_proxy(store, engine_url) as proxy:
        chat = await _chat(store, proxy, model)
        responses = await _responses(store, proxy, model)
        messages = await _messages(store, proxy, model)
    return Made(chat, responses, messages)


async def _chat(store: Store, proxy: RunningProxy, model: str) -> str:
    rollout_id, key = await new_rollout(
        store, batch_id=BATCH, task_id="capital", sample_index=0, harness="script", model=model
    )
    base_url = f"{proxy.url}/r/{key}/v1"
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused")
    try:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "What is the capital of France?"},
        ]
        for turn, follow_up in enumerate(
            ["And of Italy?", f"Ignore this: {HOSTILE} What about Spain?", "Thanks."]
        ):
            reply = await client.chat.completions.create(
                model=model,
                messages=messages,  # type: ignore[arg-type]
                **GREEDY,
            )
            answer = reply.choices[0].message.content or ""
            if turn == 1:
                # A compacting harness: the first answer goes back shortened.
                messages[2]["content"] = messages[2]["content"][:8]
            messages += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": follow_up},
            ]
        await client.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            **GREEDY,
        )
    finally:
        await client.close()
    # A malformed request is refused, and recorded as refused for the auditor.
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{base_url}/chat/completions", data=b"{oops") as resp,
    ):
        assert resp.status == 400, await resp.text()
    await _finish(
        proxy,
        rollout_id,
        status="finished",
        reward=1.0,
        reward_details={"tests_passed": 1, "tests_total": 1},
        meta={
            "logs_dir": "/var/tmp/rolltap/logs/capital-0",
            "verifier_tail": VERIFIER_TAIL,
            "harness_tail": HARNESS_TAIL,
        },
    )
    return rollout_id


async def _responses(store: Store, proxy: RunningProxy, model: str) -> str:
    rollout_id, key = await new_rollout(
        store, batch_id=BATCH, task_id="capital", sample_index=1, harness="codex", model=model
    )
    client = openai.AsyncOpenAI(base_url=f"{proxy.url}/r/{key}/v1", api_key="unused")
    try:
        items: list[dict[str, Any]] = [
            {"role": "user", "content": [{"type": "input_text", "text": "Name a planet."}]}
        ]
        first = await client.responses.create(
            model=model,
            instructions="Answer in one word.",
            input=items,  # type: ignore[arg-type]
            max_output_tokens=16,
            temperature=0,
            store=False,
        )
        items += [item.model_dump(exclude_none=True) for item in first.output]
        items.append({"role": "user", "content": [{"type": "input_text", "text": "Another."}]})
        await client.responses.create(
            model=model,
            instructions="Answer in one word.",
            input=items,  # type: ignore[arg-type]
            max_output_tokens=16,
            temperature=0,
            store=False,
        )
    finally:
        await client.close()
    await _finish(proxy, rollout_id, status="failed", reward=0.0, meta={})
    return rollout_id


async def _messages(store: Store, proxy: RunningProxy, model: str) -> str:
    rollout_id, key = await new_rollout(
        store, batch_id=BATCH, task_id="colour", sample_index=0, harness="claude-code", model=model
    )
    client = anthropic.AsyncAnthropic(base_url=f"{proxy.url}/r/{key}", api_key="unused")
    try:
        history: list[dict[str, Any]] = [{"role": "user", "content": "Name a colour."}]
        first = await client.messages.create(
            model=model,
            system="Answer briefly.",
            messages=history,  # type: ignore[arg-type]
            max_tokens=16,
            extra_body={"temperature": 0},
        )
        history += [
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {"role": "user", "content": "And another one?"},
        ]
        await client.messages.create(
            model=model,
            system="Answer briefly.",
            messages=history,  # type: ignore[arg-type]
            max_tokens=16,
            extra_body={"temperature": 0},
        )
    finally:
        await client.close()
    return rollout_id


async def _finish(proxy: RunningProxy, rollout_id: str, **fields: Any) -> None:
    """End a rollout the way a runner elsewhere does: through the proxy's admin API."""
    async with (
        aiohttp.ClientSession() as session,
        session.patch(f"{proxy.url}/admin/rollouts/{rollout_id}", json=fields) as resp,
    ):
        assert resp.status == 200, await resp.text()
