"""Egress benchmark: what the egress gate costs, side by side in one run.

    python bench/egress_bench.py [--requests 200] [--concurrency 1]

Needs `rolltap egress install`. Starts, in this process, a local HTTPS server under a made-up
host name, the real proxy (capturing into a fresh SQLite file) in front of the fake vLLM engine,
and the run's egress gate (its own process), then measures from a client on this host that
goes through the same forwarder code a sandbox runs (runner/sandboxes/forwarder.py):

- an allowed HTTPS GET: direct to the server vs through the gate (HTTPS_PROXY, the gate's CA),
  a fresh connection (and TLS handshakes) per request, as pip or curl make them;
- a chat call (non-streaming, 200-token answer): the base-URL path (`/r/<key>/v1` through the
  proxy forwarder) vs intercept mode (`https://api.openai.com/v1` through the gate, routed into
  the same rollout).

Prints p50/p90 per path and the added milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rolltap.runner.egress import EgressMode, EgressSettings, egress_gate
from rolltap.runner.egress.rules import PREAMBLE
from rolltap.runner.host import proxy_host
from rolltap.runner.sandboxes.forwarder import serve
from rolltap.store import NewRollout, Store
from tests.support.egress import ALLOWED_HOST, https_upstream, make_pki
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import fake_engine


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    return sock


async def _forward(unix_path: Path, preamble: bytes = b"") -> tuple[str, asyncio.Task[None]]:
    sock = _listening()
    port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}", asyncio.ensure_future(
        serve(sock, str(unix_path), preamble=preamble)
    )


async def _timed(n: int, one: Callable[[], Awaitable[None]]) -> list[float]:
    for _ in range(min(10, n)):
        await one()  # warm-up
    times = []
    for _ in range(n):
        started = time.perf_counter()
        await one()
        times.append((time.perf_counter() - started) * 1000)
    return times


def _row(name: str, times: list[float], base: list[float] | None) -> str:
    p50 = statistics.median(times)
    p90 = statistics.quantiles(times, n=10)[-1]
    added = "" if base is None else f"{p50 - statistics.median(base):+8.2f}"
    return f"  {name:<44} p50 {p50:8.2f} ms  p90 {p90:8.2f} ms  {added}"


async def main(requests: int) -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        pki = make_pki(tmp / "pki", (ALLOWED_HOST,))
        store = await Store.connect(f"sqlite:///{tmp / 'store.sqlite'}")
        fake = FakeVLLM(script=lambda _: Reply(text="x" * 200), record_requests=False)
        async with (
            https_upstream(pki) as (port, _),
            fake_engine(fake) as engine,
            proxy_host(store, backends=[engine.url], model="fake-model") as host,
        ):
            settings = EgressSettings(
                mode=EgressMode.INTERCEPT,
                allow=(ALLOWED_HOST,),
                resolve={ALLOWED_HOST: f"127.0.0.1:{port}"},
                upstream_ca=pki.ca,
            )
            async with egress_gate(
                settings, directory=host.socket.parent, proxy_socket=host.socket, store=store
            ) as gate:
                rollout = await store.create_rollout(NewRollout(task_id="bench", max_calls=None))
                route = await gate.admit(rollout.id, rollout.key, (ALLOWED_HOST,), intercept=True)
                proxy_url, t1 = await _forward(host.socket)
                egress_url, t2 = await _forward(
                    gate.socket, PREAMBLE + route.token.encode() + b"\n"
                )
                direct_ctx = ssl.create_default_context(cafile=str(pki.ca))
                gate_ctx = ssl.create_default_context(cafile=str(gate.bundle))
                await _measure(
                    requests, port, direct_ctx, gate_ctx, egress_url, proxy_url, rollout.key
                )
                t1.cancel()
                t2.cancel()
        await store.close()


async def _measure(
    n: int,
    port: int,
    direct_ctx: ssl.SSLContext,
    gate_ctx: ssl.SSLContext,
    egress_url: str,
    proxy_url: str,
    key: str,
) -> None:
    page = f"https://{ALLOWED_HOST}/simple/numpy"
    resolver = _StaticResolver({ALLOWED_HOST: port})

    async def fresh_direct() -> None:
        connector = aiohttp.TCPConnector(resolver=resolver, ssl=direct_ctx, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as s, s.get(page) as r:
            await r.read()

    async def fresh_gate() -> None:
        connector = aiohttp.TCPConnector(ssl=gate_ctx, force_close=True)
        async with (
            aiohttp.ClientSession(connector=connector) as s,
            s.get(page, proxy=egress_url) as r,
        ):
            assert r.status == 200, await r.text()
            await r.read()

    kept_direct = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(resolver=resolver, ssl=direct_ctx)
    )
    kept_gate = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=gate_ctx))

    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi " * 500}]}

    async def chat_base_url() -> None:
        url = f"{proxy_url}/r/{key}/v1/chat/completions"
        async with kept_direct.post(url, json=body) as r:
            assert r.status == 200, await r.text()
            await r.read()

    async def chat_intercepted() -> None:
        url = "https://api.openai.com/v1/chat/completions"
        headers = {"Authorization": "Bearer sk-harness-own-key"}
        async with kept_gate.post(url, json=body, headers=headers, proxy=egress_url) as r:
            assert r.status == 200, await r.text()
            await r.read()

    try:
        print(f"allowed HTTPS GET ({n} sequential requests)")
        base = await _timed(n, fresh_direct)
        print(_row("direct, new connection each", base, None))
        print(
            _row("through the egress gate, new connection each", await _timed(n, fresh_gate), base)
        )
        print(f"chat call, 200-token answer ({n} sequential calls)")
        base = await _timed(n, chat_base_url)
        print(_row("base URL (forwarder -> proxy)", base, None))
        print(
            _row("intercept (forwarder -> gate -> proxy)", await _timed(n, chat_intercepted), base)
        )
    finally:
        await kept_direct.close()
        await kept_gate.close()


class _StaticResolver(aiohttp.abc.AbstractResolver):
    """The made-up host name -> 127.0.0.1 for the direct path (the gate maps it itself)."""

    def __init__(self, ports: dict[str, int]) -> None:
        self._ports = ports

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict]:  # type: ignore[override,type-arg]
        return [
            {"hostname": host, "host": "127.0.0.1", "port": self._ports.get(host, port),
             "family": socket.AF_INET, "proto": 0, "flags": 0}
        ]  # fmt: skip

    async def close(self) -> None:
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main(args.requests))
