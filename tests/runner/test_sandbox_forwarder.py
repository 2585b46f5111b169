"""forwarder.py, the real script in a real process, between a TCP client and a unix socket."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest_asyncio

from rolltap.runner.sandboxes.base import FORWARDER
from tests.support.sandboxes import FakeProxy, fake_proxy, host_processes_running, short_tmp_dir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest_asyncio.fixture(loop_scope="function")
async def forwarded() -> AsyncIterator[tuple[str, FakeProxy]]:
    """(base URL, proxy) with the forwarder serving the proxy on a loopback port."""
    async with fake_proxy() as (sock, proxy):
        port = _free_port()
        ready = sock.parent / "ready"
        argv = [sys.executable, "-I", "-S", str(FORWARDER), "--listen", f"127.0.0.1:{port}"]
        proc = await asyncio.create_subprocess_exec(
            *argv, "--unix", str(sock), "--ready-file", str(ready)
        )
        try:
            for _ in range(200):
                if ready.exists():
                    break
                await asyncio.sleep(0.02)
            yield f"http://127.0.0.1:{port}", proxy
        finally:
            proc.kill()
            await proc.wait()


async def test_requests_and_large_bodies_pass_through(forwarded: tuple[str, FakeProxy]) -> None:
    url, _ = forwarded
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/hello") as resp:
            hello = await resp.text()
        async with session.post(f"{url}/echo", data=b"y" * 5_000_000) as resp:
            echoed = await resp.read()

    assert hello == "hello from the proxy"
    assert echoed == b"y" * 5_000_000


async def test_a_stream_is_passed_on_as_it_comes(forwarded: tuple[str, FakeProxy]) -> None:
    url, _ = forwarded
    async with aiohttp.ClientSession() as session, session.get(f"{url}/stream") as resp:
        first = await resp.content.readuntil(b"\n\n")
        async with session.get(f"{url}/ack") as ack:
            await ack.read()
        rest = await resp.read()

    assert first == b"data: first\n\n"
    assert rest == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"


async def test_hundreds_of_concurrent_connections(forwarded: tuple[str, FakeProxy]) -> None:
    url, proxy = forwarded
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> str:
            async with session.get(f"{url}/hello") as resp:
                return await resp.text()

        replies = await asyncio.gather(*(one() for _ in range(500)))

    assert set(replies) == {"hello from the proxy"}
    assert len(proxy.requests) == 500


async def test_without_the_proxy_a_connection_is_closed_not_hung() -> None:
    directory = short_tmp_dir()
    port = _free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, str(FORWARDER), "--listen", f"127.0.0.1:{port}"),
            *("--unix", str(directory / "absent.sock"), "--ready-file", str(directory / "r")),
            *("--connect-timeout", "0.5"),
        ]
    )
    try:
        for _ in range(200):
            if (directory / "r").exists():
                break
            await asyncio.sleep(0.02)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            got = await asyncio.wait_for(reader.read(), 30)
        except ConnectionResetError:
            got = b""  # closed with the request unread: a reset is a close too
        writer.close()
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(directory)

    assert got == b""


async def test_in_front_of_a_command_it_keeps_the_exit_status_and_dies_with_it(
    tmp_path: Path,
) -> None:
    async with fake_proxy() as (sock, _):
        port = _free_port()
        script = (
            "import urllib.request, sys; "
            f"print(urllib.request.urlopen('http://127.0.0.1:{port}/hello').read().decode()); "
            "sys.exit(7)"
        )
        argv = [sys.executable, "-I", "-S", str(FORWARDER), "--listen", f"127.0.0.1:{port}"]
        argv += ["--unix", str(sock), "--", sys.executable, "-c", script]
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()

        assert proc.returncode == 7
        assert out == b"hello from the proxy\n"
        # The serving child notices its parent is gone within its polling interval.
        for _ in range(100):
            if not host_processes_running(" ".join(argv)):
                break
            await asyncio.sleep(0.05)
        assert host_processes_running(" ".join(argv)) == []


async def test_a_command_that_never_calls_ends_with_its_serving_process() -> None:
    """The serving process of a command nobody connected to (setup, tests, an oracle) waits
    for a first client without loading asyncio, and still ends with the command."""
    async with fake_proxy() as (sock, _):
        port = _free_port()
        argv = [sys.executable, "-I", "-S", str(FORWARDER), "--listen", f"127.0.0.1:{port}"]
        argv += ["--unix", str(sock), "--", sys.executable, "-c", "import sys; sys.exit(3)"]
        proc = await asyncio.create_subprocess_exec(*argv)
        code = await proc.wait()

        assert code == 3
        for _ in range(100):
            if not host_processes_running(" ".join(argv)):
                break
            await asyncio.sleep(0.05)
        assert host_processes_running(" ".join(argv)) == []
