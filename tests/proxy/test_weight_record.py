"""Which weights served a call is part of the record: each commit stores every engine's
checksums of the new version, every call under it is sealed with their digest, `rolltap audit
verify` shows the weights per version and fails when the stored checksums no longer give a
call's seal, `rolltap audit weights` compares two versions, and the viewer shows the seal."""

from __future__ import annotations

import html
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient
from click.testing import CliRunner

from rolltap.cli.main import cli
from rolltap.store.chain import checksums_digest
from rolltap.ui import UIContext, UISettings, make_app
from tests.support.fake_vllm import FakeVLLM
from tests.support.proxy import OpenAIFactory, fake_engine, running_proxy
from tests.support.stores import opened_store
from tests.support.tamper import tamper
from tests.ui.conftest import FakeEngineTexts

Client = TestClient[web.Request, web.Application]
MESSAGES = [{"role": "user", "content": "hello"}]


async def _update(session: aiohttp.ClientSession, proxy_url: str, version: str) -> None:
    for path, body in [("begin", {"mode": "drain"}), ("commit", {"version": version})]:
        async with session.post(f"{proxy_url}/v1/weights/{path}", json=body) as resp:
            assert resp.status == 200, await resp.text()


async def test_calls_are_sealed_with_the_weights_that_served_them(
    tmp_path: Path,
    sdk: OpenAIFactory,
    aiohttp_client: Callable[[web.Application], Awaitable[Client]],
) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    fake = FakeVLLM()
    async with (
        opened_store(url) as store,
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, weight_version="1") as proxy,
    ):
        created = await store.create_rollout()
        client = sdk(f"{proxy.url}/r/{created.key}/v1", max_retries=0)
        digests = {}
        async with aiohttp.ClientSession() as session:
            for version in ("2", "3"):
                await _update(session, proxy.url, version)
                digests[version] = checksums_digest(fake.checksums())
                await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        calls = sorted(await store.calls(created.id), key=lambda c: c.seq)
        rollout_id = created.id

    assert [(c.weight_version, c.weights_digest) for c in calls] == [
        ("2", digests["2"]),
        ("3", digests["3"]),
    ]
    runner = CliRunner()
    verified = runner.invoke(cli, ["audit", "verify", rollout_id, "--db", url])
    assert verified.exit_code == 0, verified.output
    assert "intact" in verified.output
    for version in ("2", "3"):
        line = f"version '{version}': 1 call(s), weights {digests[version][:16]}, checksums of 1"
        assert line in verified.output

    compared = runner.invoke(cli, ["audit", "weights", "2", "3", "--db", url])
    assert compared.exit_code == 0, compared.output
    assert "2 -> 3: 2 changed, 0 added, 0 removed, 0 the same" in compared.output
    assert "changed  model.norm.weight" in compared.output
    same = runner.invoke(cli, ["audit", "weights", "2", "2", "--db", url])
    assert (same.exit_code, "0 changed" in same.output) == (1, True)
    unknown = runner.invoke(cli, ["audit", "weights", "2", "9", "--db", url])
    assert unknown.exit_code == 1
    assert unknown.output.strip().splitlines() == [
        "Error: no checksums stored for weight version '9': its engines offered none, or no "
        "commit put it in"
    ]

    async with opened_store(url, read_only=True) as reading:
        viewer = await aiohttp_client(make_app(UIContext(reading, UISettings(), FakeEngineTexts())))
        page = await (await viewer.get(f"/rollouts/{rollout_id}/calls/1")).text()
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())
    assert f"sealed with weights {digests['2'][:16]}" in text

    # The stored checksums of version 2 changed after the fact: its call's seal no longer holds.
    await tamper(url, "UPDATE weight_checksum SET checksums = '{}' WHERE weight_version = '2'")
    broken = runner.invoke(cli, ["audit", "verify", rollout_id, "--db", url])
    assert broken.exit_code == 1
    assert "weights  sealed with weights" in broken.output
    assert "for version '2', which the stored checksums of that version do not give" in (
        broken.output
    )
    # A call's own seal changed: its record no longer matches its digest.
    await tamper(
        url, "UPDATE call SET weights_digest = :d WHERE id = :id", d="1" * 64, id=calls[1].id
    )
    altered = runner.invoke(cli, ["audit", "verify", rollout_id, "--db", url])
    assert altered.exit_code == 1
    assert "altered" in altered.output
