"""From inside a bwrap or docker sandbox the proxy is reachable, streaming included, and nothing
else is: not the host's loopback, not another port, not the outside, not the host's unix sockets
(docker's, PostgreSQL's, an abstract one), and no raw socket can even be opened. (The local kind
is the host's network and is left out on purpose.)"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web

from rolltap.runner.sandboxes.base import Sandbox, SandboxProvider
from tests.support.sandboxes import (
    ISOLATED_KINDS,
    FakeProxy,
    fake_proxy,
    open_provider,
    plain_task,
    spec_for,
)

# Runs inside the sandbox with the image's python3: tries each target and prints what happened,
# one JSON object per line. Targets: tcp:HOST:PORT, udp:HOST:PORT, unix:PATH, abstract:NAME,
# raw: (an ICMP raw socket), packet: (a link-layer socket).
PROBE = r"""
import json, socket, sys

def attempt(kind, where):
    if kind in ("tcp", "udp"):
        host, port = where.rsplit(":", 1)
        if kind == "tcp":
            socket.create_connection((host, int(port)), timeout=3).close()
            return
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect((host, int(port)))
        s.send(b"x")
    elif kind in ("unix", "abstract"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect(where if kind == "unix" else "\0" + where)
    elif kind == "raw":
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    else:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.close()

for target in sys.argv[1:]:
    kind, _, where = target.partition(":")
    try:
        attempt(kind, where)
        print(json.dumps([target, "connected"]))
    except OSError as e:
        print(json.dumps([target, type(e).__name__]))
"""

# Reads the first event of /stream, acknowledges it on a second connection, then reads the rest.
STREAM_CLIENT = r"""
import http.client, sys
host, port = sys.argv[1], int(sys.argv[2])
conn = http.client.HTTPConnection(host, port, timeout=30)
conn.request("GET", "/stream")
resp = conn.getresponse()
first = resp.readline() + resp.readline()
ack = http.client.HTTPConnection(host, port, timeout=30)
ack.request("GET", "/ack")
ack.getresponse().read()
rest = resp.read()
sys.stdout.write((first + rest).decode())
"""


@pytest_asyncio.fixture(params=ISOLATED_KINDS, loop_scope="function")
async def proxied(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Sandbox, FakeProxy]]:
    provider: SandboxProvider = await open_provider(request.param, tmp_path / "ws")
    async with fake_proxy() as (sock, proxy):
        box = await provider.create(spec_for(plain_task(), proxy_socket=sock))
        try:
            yield box, proxy
        finally:
            await box.close()
            await provider.close()


async def test_the_proxy_answers_through_the_forwarder(
    proxied: tuple[Sandbox, FakeProxy],
) -> None:
    box, proxy = proxied
    assert box.proxy_url is not None
    script = (
        "import urllib.request, sys; "
        "print(urllib.request.urlopen(sys.argv[1] + '/hello', timeout=10).read().decode()); "
        "req = urllib.request.Request(sys.argv[1] + '/echo', data=b'x' * 1000000); "
        "print(len(urllib.request.urlopen(req, timeout=10).read()))"
    )
    result = await box.exec(["python3", "-c", script, box.proxy_url], timeout=60)

    assert result.ok, result.stderr
    assert result.stdout == "hello from the proxy\n1000000\n"
    assert proxy.requests == ["/hello"]


async def test_a_streamed_reply_arrives_while_it_is_still_streaming(
    proxied: tuple[Sandbox, FakeProxy],
) -> None:
    box, _ = proxied
    port = box.proxy_url.rsplit(":", 1)[1] if box.proxy_url else ""
    result = await box.exec(["python3", "-c", STREAM_CLIENT, "127.0.0.1", port], timeout=60)

    assert result.ok, result.stderr
    events = [line for line in result.stdout.splitlines() if line]
    assert events == ["data: first", "data: 0", "data: 1", "data: 2", "data: [DONE]"]


async def test_many_concurrent_connections_all_get_through(
    proxied: tuple[Sandbox, FakeProxy],
) -> None:
    box, proxy = proxied
    script = (
        "import urllib.request, sys\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "get = lambda i: urllib.request.urlopen(sys.argv[1] + '/hello', timeout=30).read()\n"
        "with ThreadPoolExecutor(64) as pool:\n"
        "    print(sum(r == b'hello from the proxy' for r in pool.map(get, range(200))))\n"
    )
    result = await box.exec(["python3", "-c", script, str(box.proxy_url)], timeout=120)

    assert result.stdout == "200\n", result.stderr
    assert len(proxy.requests) == 200


async def test_nothing_but_the_proxy_is_reachable(proxied: tuple[Sandbox, FakeProxy]) -> None:
    box, _ = proxied
    host_server = web.Application()
    host_server.router.add_get("/", _host_page)
    runner = web.AppRunner(host_server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract_name = f"rolltap-probe-{secrets.token_hex(6)}"
    abstract.bind("\0" + abstract_name)
    abstract.listen()
    proxy_port = str(box.proxy_url).rsplit(":", 1)[1]
    targets = [
        f"tcp:127.0.0.1:{proxy_port}",
        f"tcp:127.0.0.1:{host_port}",
        f"tcp:{_host_address()}:{host_port}",
        "tcp:127.0.0.1:5432",
        "tcp:1.1.1.1:53",
        "tcp:8.8.8.8:443",
        "udp:8.8.8.8:53",
        "unix:/var/run/docker.sock",
        "unix:/var/run/postgresql/.s.PGSQL.5432",
        f"abstract:{abstract_name}",
        "raw:",
        "packet:",
    ]
    try:
        # The host's server and abstract socket answer on the host: the probes are not vacuous.
        _, writer = await asyncio.open_connection("127.0.0.1", host_port)
        writer.close()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect("\0" + abstract_name)
        result = await box.exec(["python3", "-c", PROBE, *targets], user="0", timeout=60)
    finally:
        abstract.close()
        await runner.cleanup()

    outcomes = dict(json.loads(line) for line in result.stdout.splitlines())
    assert outcomes.pop(f"tcp:127.0.0.1:{proxy_port}") == "connected", result.stderr
    assert "connected" not in outcomes.values(), outcomes
    assert len(outcomes) == len(targets) - 1
    assert outcomes["raw:"] == outcomes["packet:"] == "PermissionError"


async def test_names_do_not_resolve(proxied: tuple[Sandbox, FakeProxy]) -> None:
    box, _ = proxied
    result = await box.exec(
        ["python3", "-c", "import socket; socket.getaddrinfo('deb.debian.org', 80)"], timeout=60
    )

    assert result.exit_code != 0
    assert "gaierror" in result.stderr


async def _host_page(_: web.Request) -> web.Response:
    return web.Response(text="host")


def _host_address() -> str:
    """The host's own non-loopback address (the one it would use to go outside)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))
        return str(probe.getsockname()[0])
    except OSError:
        return "192.0.2.1"
    finally:
        probe.close()
