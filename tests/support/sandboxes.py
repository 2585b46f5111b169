"""Sandbox test helpers: providers of every kind (skipping, with the reason, a kind that cannot
run here), tasks to put in them, and a real aiohttp unix-socket server standing in for the proxy."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from rolltap.proxy.server import restrict_socket
from rolltap.runner.sandboxes.apptainer import ApptainerProvider
from rolltap.runner.sandboxes.base import SandboxProvider, SandboxSpec
from rolltap.runner.sandboxes.bwrap import BwrapProvider
from rolltap.runner.sandboxes.docker import BASE_IMAGE, DockerProvider
from rolltap.runner.sandboxes.errors import SandboxUnavailable
from rolltap.runner.sandboxes.identity import sandbox_user
from rolltap.runner.sandboxes.local import LocalProvider
from rolltap.runner.tasks import Task, TaskEnvironment

KINDS = ("local", "bwrap", "docker", "apptainer")
ISOLATED_KINDS = ("bwrap", "docker", "apptainer")
APPTAINER_IMAGE = "ROLLTAP_APPTAINER_IMAGE"
"""A SIF or sandbox directory with bash, coreutils and python3, for the apptainer kind's tests."""


async def open_provider(kind: str, root: Path) -> SandboxProvider:
    """A provider of `kind`, or pytest.skip saying why this machine cannot run it."""
    if kind == "local":
        return LocalProvider(root)
    if kind == "bwrap":
        if shutil.which("bwrap") is None:
            pytest.skip("bwrap is not installed: run .ci/setup-bwrap")
        return BwrapProvider(searchable(root))
    if kind == "apptainer":
        if shutil.which("apptainer") is None:
            pytest.skip("apptainer is not installed (not in Debian bookworm main)")
        image = os.environ.get(APPTAINER_IMAGE)
        if not image:
            pytest.skip(f"apptainer: set {APPTAINER_IMAGE} to a SIF with bash and python3")
        return ApptainerProvider(searchable(root), image=image)
    try:
        provider = await DockerProvider.connect()
    except SandboxUnavailable as e:
        pytest.skip(f"docker: {e} (run .ci/setup-docker)")
    if not await provider.run(provider.raw.images, BASE_IMAGE):
        await provider.close()
        pytest.skip(f"docker: image {BASE_IMAGE} is missing (run .ci/setup-docker)")
    return provider


@asynccontextmanager
async def provider_of(kind: str, root: Path) -> AsyncIterator[SandboxProvider]:
    provider = await open_provider(kind, root)
    try:
        yield provider
    finally:
        await provider.close()


TEST_WORKSPACES = Path(tempfile.gettempdir()) / "rolltap-test-workspaces"


def searchable(root: Path) -> Path:
    """Where a test's bwrap or apptainer workspaces go. As root these kinds run as the sandbox
    user, which must look its workspaces up, and pytest's temp directories are 0700 (reset so
    by every pytest session): then a fresh directory it can search, below TEST_WORKSPACES."""
    if os.geteuid() != 0:
        return root
    TEST_WORKSPACES.mkdir(mode=0o711, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f"{root.parent.name[:40]}-", dir=TEST_WORKSPACES))
    fresh.chmod(0o711)
    return fresh


def plain_task(task_id: str = "plain", workdir: str = "/app") -> Task:
    return Task(
        id=task_id,
        instruction="nothing",
        source=Path(__file__),
        workdir=workdir,
        environment=TaskEnvironment(),
    )


def spec_for(task: Task, run_id: str = "test-run", **changes: Any) -> SandboxSpec:
    spec = SandboxSpec(task=task, run_id=run_id, rollout_id=f"r{secrets.token_hex(4)}")
    return replace(spec, **changes)


def short_tmp_dir() -> Path:
    """A directory with a short path: a unix socket path must fit in 108 bytes."""
    return Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))


class FakeProxy:
    """A real aiohttp server on a unix socket, with a streamed reply that only goes on after the
    client acknowledged the first event (so a forwarder that buffers would hang it)."""

    def __init__(self) -> None:
        self.acked = asyncio.Event()
        self.requests: list[str] = []

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_get("/hello", self._hello)
        app.router.add_post("/echo", self._echo)
        app.router.add_get("/stream", self._stream)
        app.router.add_get("/ack", self._ack)
        return app

    async def _hello(self, request: web.Request) -> web.Response:
        self.requests.append(request.path)
        return web.Response(text="hello from the proxy")

    async def _echo(self, request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    async def _ack(self, request: web.Request) -> web.Response:
        self.acked.set()
        return web.Response(text="ok")

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: first\n\n")
        await asyncio.wait_for(self.acked.wait(), 30)
        for i in range(3):
            await resp.write(f"data: {i}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@asynccontextmanager
async def fake_proxy() -> AsyncIterator[tuple[Path, FakeProxy]]:
    """(socket path, server) for a FakeProxy listening on a fresh unix socket."""
    directory = short_tmp_dir()
    sock = directory / "proxy.sock"
    proxy = FakeProxy()
    runner = web.AppRunner(proxy.app())
    await runner.setup()
    await web.UnixSite(runner, str(sock)).start()
    # As the real proxy's socket (runner/host.py): its owner and the sandboxes' group only.
    group = sandbox_user().gid
    restrict_socket(str(sock), group)
    os.chown(directory, -1, group)
    directory.chmod(0o750)
    try:
        yield sock, proxy
    finally:
        await runner.cleanup()
        shutil.rmtree(directory, ignore_errors=True)


def host_processes_running(command_line: str) -> list[int]:
    """Host PIDs whose whole command line is command_line (containers' processes included)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if cmdline.strip() == command_line:
            found.append(int(entry))
    return found
