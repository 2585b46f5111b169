"""The unix socket sandboxes reach the proxy through: only its owner and the sandboxes' group may
connect (a rollout key is a bearer token, and other local users have none of their own to
spend), and open mode, which makes a rollout for any unknown key, never applies to it."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import aiohttp
import pytest

from rolltap.runner.host import proxy_host
from rolltap.runner.sandboxes.identity import sandbox_user
from rolltap.store import Store
from tests.support.proxy import fake_engine, running_proxy
from tests.support.sandboxes import short_tmp_dir

MESSAGES = [{"role": "user", "content": "hello"}]
SYSTEM_PYTHON = "/usr/bin/python3"
"""Another user cannot run the test's own interpreter when it lives under /root (pyenv)."""
CONNECT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
    print("connected")
except OSError as e:
    print(type(e).__name__)
"""
STRANGER = 61917
GROUP_MEMBER = 61918


def _connect_as(uid: int, gid: int, sock: Path) -> str:
    done = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-c", CONNECT, str(sock)],
        user=uid,
        group=gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    return done.stdout.strip()


async def test_only_the_owner_and_the_sandboxes_group_may_connect(store: Store) -> None:
    if os.geteuid() != 0 or shutil.which(SYSTEM_PYTHON) is None:
        pytest.skip(f"needs root (to act as other users) and {SYSTEM_PYTHON}")
    directory = short_tmp_dir()
    directory.chmod(0o755)  # so that only the socket's own mode can refuse
    sock = directory / "proxy.sock"
    group = sandbox_user().gid
    try:
        async with (
            fake_engine() as engine,
            running_proxy(store, engine.url, unix_socket=str(sock), unix_socket_group=group),
        ):
            mode = sock.stat()
            stranger = _connect_as(STRANGER, STRANGER, sock)
            member = _connect_as(GROUP_MEMBER, group, sock)
    finally:
        shutil.rmtree(directory)

    assert (stat.S_IMODE(mode.st_mode), mode.st_gid) == (0o660, group)
    assert stranger == "PermissionError"
    assert member == "connected"


async def test_without_a_group_only_the_owner_may_connect(store: Store, tmp_path: Path) -> None:
    sock = tmp_path / "proxy.sock"
    async with fake_engine() as engine, running_proxy(store, engine.url, unix_socket=str(sock)):
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600


async def test_the_runners_own_proxy_lets_only_the_sandboxes_through(store: Store) -> None:
    user = sandbox_user()
    async with fake_engine() as engine, proxy_host(store, backends=[engine.url]) as host:
        sock, directory = host.socket.stat(), host.socket.parent.stat()

    assert (stat.S_IMODE(sock.st_mode), sock.st_gid) == (0o660, user.gid)
    assert (stat.S_IMODE(directory.st_mode), directory.st_gid) == (0o750, user.gid)


async def test_open_mode_never_applies_on_the_sandbox_socket(store: Store, tmp_path: Path) -> None:
    sock = tmp_path / "proxy.sock"
    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url, unix_socket=str(sock), open_mode=True) as proxy,
    ):
        connector = aiohttp.UnixConnector(path=str(sock))
        async with aiohttp.ClientSession(connector=connector) as session:
            for url, headers in (
                ("http://sandbox/r/made-up-key/v1/chat/completions", {}),
                ("http://sandbox/v1/chat/completions", {"Authorization": "Bearer made-up-key"}),
                ("http://sandbox/v1/models", {"Authorization": "Bearer made-up-key"}),
            ):
                async with session.request(
                    "GET" if url.endswith("/models") else "POST",
                    url,
                    json={"model": "m", "messages": MESSAGES},
                    headers=headers,
                ) as resp:
                    assert resp.status == 401, url
                    assert (await resp.json())["error"]["code"] == "invalid_api_key"
        on_socket = await store.rollouts()
        # The TCP listener is open: the same key makes a rollout there.
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{proxy.url}/r/made-up-key/v1/chat/completions",
                json={"model": "m", "messages": MESSAGES},
            ) as resp,
        ):
            assert resp.status == 200

    assert on_socket == []
    assert len(await store.rollouts()) == 1
