"""The viewer shows the reward-hack flags: a badge on the rollout and on the call that raised
each, a section listing them, and a filter on the rollouts list."""

from __future__ import annotations

import html
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from rolltap.analysis.hack_check import check_hacks
from rolltap.store import NewRollout, Store
from rolltap.store.events import Declared
from rolltap.ui import UIContext, UISettings, make_app
from tests.support.records import call
from tests.support.stores import opened_store
from tests.ui.conftest import FakeEngineTexts

Client = TestClient[web.Request, web.Application]
ClientMaker = Callable[[web.Application], Awaitable[Client]]
ANSWER = b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}'


def _request(commands: list[str]) -> bytes:
    messages: list[dict[str, object]] = [{"role": "user", "content": "fix the bug"}]
    for i, command in enumerate(commands):
        function = {"name": "bash", "arguments": json.dumps({"command": command})}
        tool_call = {"id": f"c{i}", "type": "function", "function": function}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [tool_call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "ok"},
        ]
    return json.dumps({"model": "m", "messages": messages}).encode()


async def _rollout(store: Store, task: str, commands: list[str], *, check: bool = True) -> str:
    rollout = await store.create_rollout(NewRollout(batch_id="hb", task_id=task))
    await store.report(rollout.id, Declared("running"))
    for n in range(1, len(commands) + 1):
        body = _request(commands[:n])
        await store.append_call(
            call(rollout.id, [1, 2], [3], request_body=body, response_body=ANSWER)
        )
    await store.report(rollout.id, Declared("finished"), reward=1.0)
    if check:
        await check_hacks(store, rollout.id, save=True)
    return rollout.id


@pytest.fixture
async def viewer(
    tmp_path: Path, aiohttp_client: ClientMaker
) -> AsyncIterator[tuple[Client, dict[str, str]]]:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    async with opened_store(url) as store:
        made = {
            "hacked": await _rollout(store, "t1", ["ls", "cat /tests/test.sh", "git reflog"]),
            "clean": await _rollout(store, "t2", ["ls", "python3 -m pytest -q"]),
            "unchecked": await _rollout(store, "t3", ["git reflog"], check=False),
        }
    async with opened_store(url, read_only=True) as store:
        client = await aiohttp_client(make_app(UIContext(store, UISettings(), FakeEngineTexts())))
        yield client, made


async def _page(client: Client, path: str, status: int = 200) -> str:
    resp = await client.get(path)
    body = await resp.text()
    assert resp.status == status, body
    return body


def _text(page: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


async def test_the_list_badges_and_filters_flagged_rollouts(
    viewer: tuple[Client, dict[str, str]],
) -> None:
    client, made = viewer

    async def listed(query: str) -> set[str]:
        page = await _page(client, f"/rollouts?{query}")
        return set(re.findall(r'href="/rollouts/([0-9A-Z]{26})"', page))

    page = await _page(client, "/rollouts")
    # One mark on the flagged rollout's reward, naming its two detectors.
    assert page.count('class="badge hack"') == 1
    assert "flagged by the reward-hack detectors: git_history, verifier_files" in page
    assert await listed("hack=any") == {made["hacked"]}
    assert await listed("hack=git_history") == {made["hacked"]}
    assert await listed("hack=proxy_admin") == set()
    assert await listed("hack=none") == {made["clean"]}
    assert await listed("hack=unchecked") == {made["unchecked"]}
    assert await listed("") == set(made.values())
    await _page(client, "/rollouts?hack=%27%3B--", 400)


async def test_the_rollout_and_its_calls_show_what_was_flagged(
    viewer: tuple[Client, dict[str, str]],
) -> None:
    client, made = viewer
    page = await _page(client, f"/rollouts/{made['hacked']}")
    text = _text(page)
    call_page = await _page(client, f"/rollouts/{made['hacked']}/calls/3")
    clean = _text(await _page(client, f"/rollouts/{made['clean']}"))

    assert 'id="hacks"' in page
    assert "⚑ git history ⚑ verifier files 2 flags" in text
    assert "reads the reflog" in text
    assert "touches the verifier's path /tests" in text
    assert "git reflog" in text
    # The timeline and the turns badge the call that raised each flag.
    assert page.count('href="#hacks">⚑ git history</a>') == 1
    assert page.count('#hacks" title="reads the reflog: git reflog">⚑ git history</a>') == 1
    assert "⚑ git history" in _text(call_page)
    assert "none found by the reward-hack detectors" in clean
