"""The rollout's key is revoked when its harness ends: a call made after that (by a daemon the
agent left, say) is refused in the client's own error shape, recorded as a rejected call that
`rolltap show` and the store show, and never reaches the engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rolltap.runner import run_batch
from rolltap.runner.sandboxes.base import Sandbox, SandboxProvider, SandboxSpec
from rolltap.runner.tasks import load_tasks
from rolltap.store import CallStatus, RolloutStatus, Store
from tests.support.fake_harness import ShellHarness, cleanup, shell_installation
from tests.support.proxy import fake_engine
from tests.support.sandboxes import provider_of

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


class CallsAtReap:
    """A real provider whose sandboxes, when reaped (the harness has just ended), call the proxy
    with the rollout's key first, as a daemon the agent left would: what a call gets then."""

    def __init__(self, inner: SandboxProvider, key_file: Path) -> None:
        self.kind = inner.kind
        self._inner = inner
        self._key_file = key_file
        self.answers: list[tuple[int, Any]] = []

    async def create(self, spec: SandboxSpec) -> Sandbox:
        return _Calling(await self._inner.create(spec), spec, self)

    async def sweep(self, run_id: str) -> int:
        return await self._inner.sweep(run_id)

    async def close(self) -> None:
        await self._inner.close()


class _Calling:
    def __init__(self, box: Sandbox, spec: SandboxSpec, provider: CallsAtReap) -> None:
        self._box = box
        self._spec = spec
        self._provider = provider

    def __getattr__(self, name: str) -> Any:
        return getattr(self._box, name)

    async def reap(self) -> None:
        if not self._provider.answers:
            await self._box.get("/logs/agent/key", self._provider._key_file)
            key = self._provider._key_file.read_text().strip()
            assert self._spec.proxy_socket is not None
            connector = aiohttp.UnixConnector(path=str(self._spec.proxy_socket))
            # Valid in both dialects: only the key can make it fail.
            body = {
                "model": "m",
                "max_tokens": 16,
                "messages": [{"role": "user", "content": "one more"}],
            }
            async with aiohttp.ClientSession(connector=connector) as session:
                for url, headers in (
                    (f"http://sandbox/r/{key}/v1/chat/completions", {}),
                    ("http://sandbox/v1/messages", {"x-api-key": key}),
                ):
                    async with session.post(url, json=body, headers=headers) as resp:
                        self._provider.answers.append((resp.status, await resp.json()))
        await self._box.reap()


@pytest.mark.parametrize("kind", ["local", "bwrap", "docker"])
async def test_a_call_after_the_harness_ended_is_refused_and_recorded(
    kind: str, store: Store, db_url: str, tmp_path: Path
) -> None:
    installed = shell_installation()
    harness = ShellHarness(
        'python3 "$ROLLTAP_ASK" "say hello" && echo hello > hello.txt'
        " && echo $ROLLTAP_KEY > /logs/agent/key"
    )
    hello = [t for t in load_tasks(EXAMPLES) if t.id == "hello-file"]
    try:
        async with fake_engine() as engine, provider_of(kind, tmp_path / "boxes") as real:
            provider = CallsAtReap(real, tmp_path / "key")
            result = await run_batch(
                hello,
                harness=harness,
                installed=installed,
                harness_from="host",
                sandbox=provider,
                backends=[engine.url],
                store=store,
                logs_root=tmp_path / "logs",
            )
            engine_calls = len(engine.fake.requests)
    finally:
        cleanup(installed)

    (done,) = result.results
    assert (done.status, done.reward) == (RolloutStatus.SUCCEEDED, 1.0)
    chat, messages = provider.answers
    assert chat[0] == messages[0] == 403
    assert chat[1]["error"]["code"] == "rollout_key_revoked"  # OpenAI's error shape
    assert messages[1]["type"] == "error"  # Anthropic's
    assert messages[1]["error"]["type"] == "permission_error"
    assert "revoked" in messages[1]["error"]["message"]
    assert engine_calls == 1  # the harness's own call, and no other
    calls = await store.calls(done.rollout_id)
    assert [c.status for c in calls] == [CallStatus.OK, CallStatus.REJECTED, CallStatus.REJECTED]
    assert all("revoked when its harness ended" in (c.error or "") for c in calls[1:])
    assert (await store.rollout(done.rollout_id)).key_revoked_at is not None
    shown = subprocess.run(
        [sys.executable, "-m", "rolltap.cli.main", "show", done.rollout_id, "--db", db_url],
        capture_output=True,
        text=True,
        check=True,
    )
    # Both refused calls, in its call list and again among the refusals its audit lists.
    assert shown.stdout.count("revoked when its harness ended") == 4
