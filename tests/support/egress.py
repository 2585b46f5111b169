"""Egress test helpers: a CA and a certificate for made-up host names (openssl), a real HTTPS
server with them on loopback, and the gate's install or a skip saying how to get it."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from rolltap.runner.egress import EgressUnavailable
from rolltap.runner.egress.install import egress_python

ALLOWED_HOST = "pkgs.rolltap.test"
DENIED_HOST = "answers.rolltap.test"


def require_gate() -> None:
    try:
        egress_python()
    except EgressUnavailable as e:
        pytest.skip(str(e))


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path


def make_pki(directory: Path, hosts: tuple[str, ...]) -> Pki:
    """A CA and a leaf certificate for `hosts`, signed by it (openssl, as on every Debian)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (
        directory / n for n in ("ca.key", "ca.pem", "leaf.key", "leaf.csr", "leaf.pem")
    )
    ext = directory / "leaf.ext"
    ext.write_text("subjectAltName=" + ",".join(f"DNS:{h}" for h in hosts) + "\n")
    for argv in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca,
         "-days", "2", "-subj", "/CN=rolltap test CA"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
         "-subj", f"/CN={hosts[0]}"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
         "-out", cert, "-days", "2", "-extfile", ext],
    ):  # fmt: skip
        subprocess.run(["openssl", *map(str, argv)], check=True, capture_output=True)
    return Pki(ca, cert, key)


class Upstream:
    """What the made-up hosts serve: a page, an echo of an upload's size, a large body."""

    def __init__(self) -> None:
        self.hits: list[str] = []

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_get("/simple/{name}", self._page)
        app.router.add_post("/upload", self._upload)
        app.router.add_get("/large", self._large)
        return app

    async def _page(self, request: web.Request) -> web.Response:
        self.hits.append(f"{request.host} {request.path}")
        return web.Response(text=f"index of {request.match_info['name']} at {request.host}")

    async def _upload(self, request: web.Request) -> web.Response:
        return web.Response(text=str(len(await request.read())))

    async def _large(self, request: web.Request) -> web.Response:
        return web.Response(body=b"x" * (1 << 20))


@asynccontextmanager
async def https_upstream(pki: Pki) -> AsyncIterator[tuple[int, Upstream]]:
    """(port on 127.0.0.1, the server's record of what it served)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.cert, pki.key)
    upstream = Upstream()
    runner = web.AppRunner(upstream.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield port, upstream
    finally:
        await runner.cleanup()
