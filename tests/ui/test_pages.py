"""The viewer's pages over HTTP (no browser): content, read-only, the token guard, bad input."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from click.testing import CliRunner

from rolltap.audit.replay import (
    REPLAY_OF,
    REPLAYS,
    REPORT_KEY,
    CallReplay,
    Divergence,
    MessageChange,
    Mode,
    Outcome,
    ReplayReport,
    Served,
)
from rolltap.cli.main import cli
from rolltap.proxy.control.admin import ExposedWithoutToken
from rolltap.store import EgressRecord, EgressVerdict, NewRollout, Store
from rolltap.store.ids import new_id
from rolltap.ui import UIContext, UISettings, make_app
from rolltap.ui.auth import COOKIE, check_binding
from tests.support.audit_rollouts import BATCH, HOSTILE, Made, make_rollouts
from tests.support.fake_vllm import MODEL
from tests.support.proxy import fake_engine
from tests.support.stores import opened_store
from tests.support.tamper import fetch, tamper
from tests.ui.conftest import FakeEngineTexts

ClientMaker = Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]]
Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def viewer(
    fake_store: tuple[str, Made], aiohttp_client: ClientMaker
) -> AsyncIterator[tuple[Client, Store, Made]]:
    url, made = fake_store
    async with opened_store(url, read_only=True) as store:
        client = await aiohttp_client(make_app(UIContext(store, UISettings(), FakeEngineTexts())))
        yield client, store, made


async def _page(client: Client, path: str, status: int = 200) -> str:
    resp = await client.get(path)
    body = await resp.text()
    assert resp.status == status, body
    return body


def _text(page: str) -> str:
    """The page's visible text, roughly: tags dropped, entities decoded, spaces squeezed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


async def test_batches_and_batch_page(viewer: tuple[Client, Store, Made]) -> None:
    client, _, _ = viewer
    listing = _text(await _page(client, "/"))
    assert f"{BATCH} 3 2" in listing  # 3 rollouts of 2 tasks
    assert "1 / 2" in listing  # one of the two rewarded rollouts passed

    batch = await _page(client, f"/batches/{BATCH}")
    assert batch.count('class="bar"') == 2  # binary rewards: a bar for 0 and one for 1
    assert "<title>reward 0: 1</title>" in batch
    assert "<title>reward 1: 1</title>" in batch
    # Mean over tasks: capital passed 1 of 2 (pass@1 50%), colour 0 of 1; only capital has k=2.
    assert "<title>pass@1 = 25.0%</title>" in batch
    assert "<title>pass@2 = 100.0%</title>" in batch
    assert "1 without a reward" in _text(batch)
    await _page(client, "/batches/no-such-batch", 404)


async def test_rollout_filters(viewer: tuple[Client, Store, Made]) -> None:
    client, _, made = viewer

    async def listed(query: str) -> set[str]:
        page = await _page(client, f"/rollouts?{query}")
        return set(re.findall(r'href="/rollouts/([0-9A-Z]{26})"', page))

    everything = {made.chat, made.responses, made.messages}
    assert await listed("") == everything
    assert await listed(f"batch={BATCH}&task=capital") == {made.chat, made.responses}
    assert await listed("harness=claude-code") == {made.messages}
    assert await listed("status=failed") == {made.responses}
    assert await listed("min_reward=0.5") == {made.chat}
    assert await listed("max_reward=0.5") == {made.responses}
    assert await listed("drift=history_edited") == {made.chat}
    assert await listed("drift=none") == {made.responses}  # analysed and unbroken
    assert await listed("drift=any&harness=codex") == set()


async def test_rollout_page_shows_the_whole_story(viewer: tuple[Client, Store, Made]) -> None:
    client, store, made = viewer
    page = await _page(client, f"/rollouts/{made.chat}")
    text = _text(page)
    calls = await store.calls(made.chat)

    assert "finished" in text
    assert 'class="status v-passed"' in page, "how the run ended, and apart from it, the verdict"
    assert "reward 1" in text.lower()
    assert "PASSED tests/test_answer.py::test_capital" in text  # the tail, colour codes gone
    assert "\x1b" not in page
    assert "step 2: write answer.txt" in text
    assert "tests_passed 1" in text
    # The timeline: one row per call, each with its latency lane, the refused one too.
    assert page.count('<svg class="lane"') == len(calls) == 5
    assert "left out of training: rejected" in text
    # The record is intact and sealed; the refused request is listed with its reason.
    assert "intact every call's record matches its digest" in text
    assert "5 calls chained · sealed at call 5" in text
    assert "request body is not valid JSON" in text
    # The break: its class, where it happened, and the message diff.
    assert "history edited at call 3 → segment #1" in text
    assert "the harness changed an assistant answer" in text
    assert re.search(r"<del>[^<]+</del>", page)
    # Each turn's new messages as the harness sent them; hostile text stays text.
    assert "What is the capital of France?" in text
    assert "And of Italy?" in text
    assert HOSTILE in text
    assert HOSTILE not in page
    assert "History changed at message #2" in text
    # Token strips load per call (the refused call has none).
    assert page.count('class="strip-slot"') == 4


async def test_token_strip_fragment(viewer: tuple[Client, Store, Made]) -> None:
    client, store, made = viewer
    first = (await store.calls(made.chat))[0]
    tokens = await store.call_tokens(first.id)
    fragment = await _page(client, f"/rollouts/{made.chat}/calls/1/tokens")

    sampled = re.findall(r'<i class="s l\d[^"]*" title="[^"]*">([^<]*)</i>', fragment)
    assert len(sampled) == len(tokens.choices[0].token_ids)
    answer = html.unescape("".join(sampled)).replace("↵", "")
    received = await (await client.get(f"/rollouts/{made.chat}/calls/1/response.json")).json()
    assert answer == received["choices"][0]["message"]["content"]
    assert answer.startswith("echo: What is")
    # The prompt is shaded as not sampled, and the break is marked where it happened.
    assert 'class="c' in fragment
    assert "⚡ history edited → #1" in fragment
    assert re.search(r'<i class="s l\d x"', fragment)  # sampled, then lost to the break
    # A window: only the tokens asked for.
    window = await _page(client, f"/rollouts/{made.chat}/calls/1/tokens?from=0&to=5")
    assert len(re.findall(r"<i class=", window)) == 5
    assert "more tokens" in window
    await _page(client, f"/rollouts/{made.chat}/calls/1/tokens?from=x", 400)


async def test_every_dialect_shows_its_messages(viewer: tuple[Client, Store, Made]) -> None:
    client, _, made = viewer
    responses = _text(await _page(client, f"/rollouts/{made.responses}"))
    assert "Answer in one word." in responses
    assert "Name a planet." in responses
    assert "Another." in responses
    assert "3 earlier messages as before" in responses
    messages = _text(await _page(client, f"/rollouts/{made.messages}"))
    assert "Answer briefly." in messages
    assert "Name a colour." in messages
    assert "And another one?" in messages
    assert "no verifier or harness output recorded" in messages
    assert "not sealed yet (the rollout has not ended)" in messages

    call = _text(await _page(client, f"/rollouts/{made.messages}/calls/2"))
    assert "Name a colour." in call
    assert "And another one?" in call
    raw = await client.get(f"/rollouts/{made.messages}/calls/2/request.json")
    assert raw.status == 200
    assert raw.content_type == "application/json"
    assert (await raw.json())["system"] == "Answer briefly."


async def test_read_only_and_headers(viewer: tuple[Client, Store, Made]) -> None:
    client, store, made = viewer
    before = await store.rollout(made.chat)
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        resp = await client.request(method, f"/rollouts/{made.chat}")
        assert resp.status == 405
        assert "GET" in resp.headers["Allow"]
    assert await store.rollout(made.chat) == before

    resp = await client.get(f"/rollouts/{made.chat}")
    assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
    assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
    assert resp.headers["Cache-Control"] == "no-store"
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    head = await client.head("/rollouts")
    assert head.status == 200


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/rollouts?status=bogus", 400, "status 'bogus': use one of"),
        ("/rollouts?min_reward=lots", 400, "min_reward 'lots' is not a number"),
        ("/rollouts?drift=gremlins", 400, "drift 'gremlins': use one of"),
        ("/rollouts?page=0", 400, "page '0' is not a page number"),
        ("/rollouts/01ARZ3NDEKTSV4RRFFQ69G5FAV", 404, "no rollout"),
        ("/nowhere", 404, "Not Found"),
    ],
)
async def test_bad_requests_get_one_clear_page(
    viewer: tuple[Client, Store, Made], path: str, status: int, says: str
) -> None:
    client, _, _ = viewer
    assert says in html.unescape(await _page(client, path, status))


async def test_unknown_call(viewer: tuple[Client, Store, Made]) -> None:
    client, _, made = viewer
    assert "no call 9 in rollout" in await _page(client, f"/rollouts/{made.chat}/calls/9", 404)


async def test_admin_token_guards_every_page(
    fake_store: tuple[str, Made], aiohttp_client: ClientMaker
) -> None:
    url, made = fake_store
    async with opened_store(url, read_only=True) as store:
        settings = UISettings(admin_token="s3cret")
        client = await aiohttp_client(make_app(UIContext(store, settings, FakeEngineTexts())))
        for path in ("/", f"/rollouts/{made.chat}", "/static/ui.css", "/nowhere"):
            resp = await client.get(path)
            assert resp.status == 401, path
            assert "s3cret" not in await resp.text()
        assert (await client.get("/?token=wrong")).status == 401
        bearer = await client.get("/rollouts", headers={"Authorization": "Bearer s3cret"})
        assert bearer.status == 200

        entry = await client.get("/rollouts?batch=ui-batch&token=s3cret", allow_redirects=False)
        assert entry.status == 303
        assert entry.headers["Location"] == "/rollouts?batch=ui-batch"
        cookie = entry.cookies[COOKIE]
        assert cookie["httponly"]
        assert cookie["samesite"] == "Strict"
        assert "s3cret" not in cookie.value
        # The client keeps the cookie: plain links work from now on.
        assert (await client.get(f"/rollouts/{made.chat}")).status == 200
        client.session.cookie_jar.clear()
        forged: dict[str, Any] = {COOKIE: "s3cret"}
        assert (await client.get("/", cookies=forged)).status == 401


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_loopback_needs_no_token(host: str) -> None:
    check_binding(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.7", "viewer.example.org"])
def test_beyond_loopback_needs_the_token(host: str) -> None:
    with pytest.raises(ExposedWithoutToken, match="set --admin-token"):
        check_binding(host, None)
    check_binding(host, "a-token")


def test_cli_refuses_with_one_line(tmp_path: Any) -> None:
    exposed = CliRunner().invoke(cli, ["ui", "--host", "0.0.0.0", "--db", str(tmp_path / "s")])
    assert exposed.exit_code == 2
    assert "set --admin-token (or ROLLTAP_ADMIN_TOKEN)" in exposed.output
    assert "Traceback" not in exposed.output

    missing = CliRunner().invoke(cli, ["ui", "--db", str(tmp_path / "none.sqlite")])
    assert missing.exit_code == 1
    assert missing.output.strip() == (
        f"Error: no rolltap store at {tmp_path / 'none.sqlite'} "
        "(`rolltap run`, `serve`, `demo` or `db upgrade` creates one)"
    )
    assert not (tmp_path / "none.sqlite").exists()


@pytest.mark.parametrize("edit", ["one token", "token count"])
async def test_a_tampered_record_is_named(
    tmp_path: Any, aiohttp_client: ClientMaker, edit: str
) -> None:
    """An attacker changes call 2's sampled tokens in the database: the page says NOT INTACT
    and names the call, in the integrity section and on the timeline. Ids that no longer match
    their logprobs cannot be assembled at all: the page still opens and says so."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    async with opened_store(url) as writer:
        async with fake_engine() as engine:
            made = await make_rollouts(writer, engine.url, MODEL)
        second = (await writer.calls(made.chat))[1]
    query = "SELECT token_ids FROM choice WHERE call_id = :call"
    ids = np.frombuffer(await fetch(url, query, call=second.id), dtype="<i4").copy()
    ids = ids[:3] if edit == "token count" else np.where(np.arange(len(ids)) == 2, 70, ids)
    update = "UPDATE choice SET token_ids = :ids WHERE call_id = :call"
    assert await tamper(url, update, ids=ids.astype("<i4").tobytes(), call=second.id) == 1

    async with opened_store(url, read_only=True) as store:
        client = await aiohttp_client(make_app(UIContext(store, UISettings(), FakeEngineTexts())))
        page = await _page(client, f"/rollouts/{made.chat}")
    text = _text(page)
    assert "NOT INTACT" in text
    named = '<span class="badge drift">altered</span></td><td><a href="#call-2">2</a>'
    assert named in page
    assert '<a class="badge drift" href="#integrity">altered</a>' in page
    cannot = "cannot be assembled into segments" in text
    assert cannot == (edit == "token count")


async def test_a_replay_report_is_on_both_rollout_pages(
    tmp_path: Any, aiohttp_client: ClientMaker
) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    async with opened_store(url) as store:
        original = (await store.create_rollout(NewRollout(batch_id="b", task_id="roll"))).id
        replay = (await store.create_rollout(NewRollout(batch_id="replay-b", task_id="roll"))).id
        diff = ["@@ -3,3 +3,3 @@", "   output:", "-  1784627348", "+  2692432919"]
        change = MessageChange("changed", 3, "tool", diff)
        divergence = Divergence([], [change], "message 3 (tool) changed: -  1784627348")
        report = ReplayReport(
            original=original,
            replay=replay,
            mode=Mode.REPLAY,
            calls=[
                CallReplay(1, "main", Outcome.MATCHED, Served.RECORDED, "c1", 1, "r1"),
                CallReplay(2, "main", Outcome.DIVERGED, Served.RECORDED, "c2", 2, "r2", divergence),
            ],
            recorded_reward=1.0,
            replayed_reward=0.0,
            recorded_status="finished",
            replayed_status="finished",
            normalization="v1",
        )
        await store.update_rollout(replay, meta={REPLAY_OF: original, REPORT_KEY: report.to_json()})
        await store.update_rollout(original, meta={REPLAYS: [replay]})
    async with opened_store(url, read_only=True) as store:
        client = await aiohttp_client(make_app(UIContext(store, UISettings(), FakeEngineTexts())))
        replay_page = await _page(client, f"/rollouts/{replay}")
        original_page = _text(await _page(client, f"/rollouts/{original}"))

    text = _text(replay_page)
    assert "Replay · replay · normalization v1" in text
    assert f"diverged at call 2 · reward 0 replayed, 1 recorded · replay of {original}" in text
    assert "Call 2, as replayed, against recorded call 2" in text
    assert "<del>-  1784627348</del>" in replay_page
    assert "<ins>+  2692432919</ins>" in replay_page
    assert f'href="/rollouts/{original}#call-2"' in replay_page
    assert f"latest replay {replay}" in original_page
    assert "message 3 (tool) changed" in original_page


async def test_the_rollout_page_lists_its_egress_requests(
    tmp_path: Any, aiohttp_client: ClientMaker
) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    now = datetime.now(UTC)
    async with opened_store(url) as store:
        quiet = (await store.create_rollout(NewRollout(task_id="offline"))).id
        rollout = (await store.create_rollout(NewRollout(task_id="online"))).id
        await store.record_egress(
            [
                EgressRecord(
                    new_id(), rollout, now, "GET", "pypi.org", "/simple/numpy/", 200, 0, 4096,
                    EgressVerdict.ALLOWED, "on the allow-list",
                ),
                EgressRecord(
                    new_id(), rollout, now, "GET", "github.com", f"/{HOSTILE}", 403, 0, 80,
                    EgressVerdict.DENIED, "github.com is not on this rollout's allow-list",
                ),
            ]
        )  # fmt: skip
    async with opened_store(url, read_only=True) as store:
        client = await aiohttp_client(make_app(UIContext(store, UISettings(), FakeEngineTexts())))
        page = await _page(client, f"/rollouts/{rollout}")
        without = await _page(client, f"/rollouts/{quiet}")
    text = _text(page)

    assert "Egress · 2 requests · 1 denied" in text
    assert "github.com is not on this rollout's allow-list" in text
    assert "pypi.org" in text
    assert HOSTILE not in page  # a path the agent chose stays text
    assert 'id="egress"' not in without
