"""The rollout service on loopback for tests: the real proxy with /v1/batches mounted, in front
of a fake engine, running rollouts in real sandboxes, driven with the real client."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rolltap.client import AsyncClient
from rolltap.proxy.context import ProxySettings
from rolltap.proxy.server import RunningProxy, start_proxy
from rolltap.runner.egress import EgressSettings
from rolltap.runner.harnesses import Harness, Installation, adapters, builtins
from rolltap.runner.sandboxes.identity import sandbox_user
from rolltap.runner.service import PoolSizes, RunnerSettings, ServiceLimits, extension
from rolltap.store import Store
from tests.support.fake_harness import ShellHarness, shell_installation
from tests.support.sandboxes import short_tmp_dir


@dataclass
class RunningService:
    proxy: RunningProxy
    client: AsyncClient
    socket_dir: Path

    @property
    def url(self) -> str:
        return self.proxy.url


def shell_harnesses(**scripts: str) -> tuple[dict[str, Harness], dict[str, Installation]]:
    """Shell harnesses by name (each runs its script; see tests/support/fake_harness.py) next to
    rolltap's own adapters, and installations for them."""
    harnesses: dict[str, Harness] = adapters() | builtins()
    installations: dict[str, Installation] = {}
    for name, script in scripts.items():
        harnesses[name] = ShellHarness(script, name=name)
        installations[name] = shell_installation()
    return harnesses, installations


@contextlib.asynccontextmanager
async def running_service(
    store: Store,
    *backends: str,
    logs: Path,
    scripts: Mapping[str, str] | None = None,
    encoding: str = "base64",
    concurrency: int = 8,
    admin_token: str | None = None,
    egress: EgressSettings | None = None,
    ray_address: str | None = None,
    **proxy_settings: Any,
) -> AsyncIterator[RunningService]:
    harnesses, installations = shell_harnesses(**(scripts or {}))
    runner = RunnerSettings(
        limits=ServiceLimits(
            sandboxes=("bwrap", "local"), default_sandbox="bwrap", max_concurrency=concurrency
        ),
        pools=PoolSizes(concurrency, concurrency, concurrency),
        logs_root=logs,
        harnesses=harnesses,
        installations=installations,
        egress=egress or EgressSettings(),
        ray_address=ray_address,
    )
    socket_dir = short_tmp_dir()
    group = sandbox_user().gid
    settings = ProxySettings(
        backends=list(backends),
        port=0,
        health_interval=0.2,
        unix_socket=str(socket_dir / "proxy.sock"),
        unix_socket_group=group,
        admin_token=admin_token,
        **proxy_settings,
    )
    proxy = await start_proxy(settings, store, [extension(runner)])
    # As runner/host.py: the socket admits the sandboxes' group; let it through the directory.
    os.chown(socket_dir, -1, group)
    socket_dir.chmod(0o750)
    client = AsyncClient(proxy.url, token=admin_token or "", encoding=encoding)
    try:
        yield RunningService(proxy, client, socket_dir)
    finally:
        await client.close()
        await proxy.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)
        for inst in installations.values():
            shutil.rmtree(str(inst.prefix), ignore_errors=True)


# Two chained turns: one trajectory of answer, observation, answer; answer.txt holds the last.
TWO_TURNS = """
python3 - <<'PY'
import json, os, urllib.request

def ask(messages):
    body = {"model": os.environ["ROLLTAP_MODEL"], "messages": messages}
    request = urllib.request.Request(
        os.environ["ROLLTAP_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": "Bearer " + os.environ["ROLLTAP_KEY"]})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)["choices"][0]["message"]["content"]

history = [{"role": "user", "content": "first"}]
history.append({"role": "assistant", "content": ask(history)})
history.append({"role": "user", "content": "tool output"})
open("answer.txt", "w").write(ask(history))
PY
"""
