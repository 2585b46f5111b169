"""The egress gate: one process per run, mitmproxy with rolltap's addon, in its own interpreter.

    python -E -s gate.py CONFIG.json

It imports only the standard library, mitmproxy and rules.py beside it (mitmproxy pins versions
rolltap's own dependencies outgrew, so it lives in a venv of its own: install.py).

- Sandboxes connect to `socket` (a unix socket beside the proxy's) through their forwarder,
  which opens each connection with `ROLLTAP-EGRESS <token>`; the gate pipes the rest to
  mitmproxy on loopback and remembers which rollout owns that loopback connection.
- Each HTTP request is decided (rules.py): allowed (passed on), intercepted (an LLM API host,
  sent to the proxy's unix socket as `/r/<key>/...` under the rollout's key, whatever key the
  harness sent) or denied (a 403 whose body says why). Non-HTTP tunnels pass only to allowed
  hosts. Every decision is reported as one JSON line on stdout.
- The CA (certificate and private key) is made here in `confdir`, which only the runner's user
  can read; sandboxes get the certificate alone.

Control, JSON lines: stdin `{"op": "add", "token", "rollout", "key", "allow", "intercept"}` and
`{"op": "remove", "token"}`, each acknowledged on stdout (`{"event": "added"|"removed", ...}`);
stdout starts with `{"event": "ready", "ca_cert": PATH}`. EOF on stdin ends the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import rules
else:
    import rules  # beside this file: the interpreter runs it as a script

BUFFER = 1 << 16
PREAMBLE_LIMIT = 256
STRIPPED_AUTH = ("authorization", "x-api-key", "proxy-authorization", "openai-organization")
"""Credentials a harness sends to its LLM host; the rollout's key replaces them."""


@dataclass(frozen=True)
class Pass:
    """One rollout's right to use the gate (its forwarder's token)."""

    rollout: str
    key: str
    allow: tuple[str, ...]
    intercept: bool


class _Link:
    """One sandbox connection's entry in Gate.by_port (compared by identity)."""

    def __init__(self, granted: Pass) -> None:
        self.granted = granted


class Reporter:
    """Writes protocol lines to the real stdout; mitmproxy's own output goes to stderr."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)

    def send(self, event: dict[str, Any]) -> None:
        self._out.write(json.dumps(event, separators=(",", ":")) + "\n")


class Gate:
    def __init__(self, config: dict[str, Any], reporter: Reporter) -> None:
        self.config = config
        self.reporter = reporter
        self.passes: dict[str, Pass] = {}
        self.by_port: dict[int, _Link] = {}
        """The gate's loopback port of each live connection to mitmproxy -> its rollout."""
        self.mitm_port = 0
        self.relay_port = 0
        self.intercept_hosts = tuple(config.get("intercept_hosts") or rules.DEFAULT_INTERCEPT_HOSTS)
        self.resolve: dict[str, tuple[str, int]] = {}
        for host, target in (config.get("resolve") or {}).items():
            h, _, p = str(target).rpartition(":")
            self.resolve[rules.normalize_host(host)] = (h, int(p))

    # --- sandbox side: the unix socket -------------------------------------------------------

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\n"), 10)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            writer.close()
            return
        line = line[:PREAMBLE_LIMIT]
        token = line[len(rules.PREAMBLE) :].strip().decode("ascii", "replace")
        granted = self.passes.get(token) if line.startswith(rules.PREAMBLE) else None
        if granted is None:
            # Read the client's request head first: a reply before it would reach the client
            # as a reset connection instead of a readable refusal.
            with contextlib.suppress(
                asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError
            ):
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            writer.write(
                _refusal(403, "egress is closed for this sandbox (no valid rollout token)")
            )
            await _close(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.mitm_port)
        except OSError:
            writer.close()
            return
        port = up_writer.get_extra_info("sockname")[1]
        link = _Link(granted)
        self.by_port[port] = link
        try:
            await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
        finally:
            up_writer.close()
            writer.close()
            # Hooks of this connection may still run (a flow's error): let them find it first,
            # and leave the port alone if a new connection has it by then.
            asyncio.get_running_loop().call_later(30, self._forget, port, link)

    def _forget(self, port: int, link: _Link) -> None:
        if self.by_port.get(port) is link:
            del self.by_port[port]

    # --- host side: intercepted calls to the proxy's unix socket -----------------------------

    async def relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.config["proxy_socket"])
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
        finally:
            up_writer.close()
            writer.close()

    # --- control ----------------------------------------------------------------------------

    def control(self, message: dict[str, Any]) -> None:
        op, token = message.get("op"), str(message.get("token", ""))
        if op == "add":
            self.passes[token] = Pass(
                str(message["rollout"]),
                str(message["key"]),
                tuple(message.get("allow") or ()),
                bool(message.get("intercept")),
            )
            self.reporter.send({"event": "added", "token": token})
        elif op == "remove":
            self.passes.pop(token, None)
            self.reporter.send({"event": "removed", "token": token})

    # --- the mitmproxy addon ----------------------------------------------------------------

    def owner(self, flow: Any) -> Pass | None:
        return self._owner_of(flow.client_conn.peername)

    def _owner_of(self, peer: Any) -> Pass | None:
        link = self.by_port.get(peer[1]) if peer else None
        return None if link is None else link.granted

    async def requestheaders(self, flow: Any) -> None:
        from mitmproxy import http

        granted = self.owner(flow)
        flow.metadata["rolltap_started"] = time.time()
        flow.metadata["rolltap_host"] = flow.request.host
        flow.metadata["rolltap_path"] = flow.request.path
        if granted is None:
            decision = rules.Decision(rules.DENIED, "connection of no known rollout")
        else:
            decision = rules.decide(
                flow.request.host,
                allow=granted.allow,
                intercept=self.intercept_hosts,
                intercepting=granted.intercept,
            )
            mapped = rules.normalize_host(flow.request.host) in self.resolve
            if decision.verdict == rules.ALLOWED and not mapped:
                _, why = await self.vet(flow.request.host, flow.request.port)
                if why is not None:
                    decision = rules.Decision(rules.DENIED, why)
        flow.metadata["rolltap_pass"] = granted
        flow.metadata["rolltap_decision"] = decision
        if decision.verdict == rules.DENIED:
            body = f"rolltap egress: request refused: {decision.reason}\n"
            headers = {"content-type": "text/plain; charset=utf-8", "x-rolltap-egress": "denied"}
            flow.response = http.Response.make(403, body, headers)
        elif decision.verdict == rules.INTERCEPTED and _is_websocket(flow.request):
            # The proxy speaks Responses over HTTP only; 426 makes Codex fall back to it at once
            # (a 404 costs it seven retries, a 400 ends its turn).
            headers = {"content-type": "text/plain; charset=utf-8"}
            flow.response = http.Response.make(426, "use HTTP, not a WebSocket\n", headers)
        elif decision.verdict == rules.INTERCEPTED:
            assert granted is not None
            for name in STRIPPED_AUTH:
                flow.request.headers.pop(name, None)
            flow.request.headers["authorization"] = f"Bearer {granted.key}"
            flow.request.scheme = "http"
            flow.request.host = "127.0.0.1"
            flow.request.port = self.relay_port
            flow.request.path = f"/r/{granted.key}{flow.request.path}"
        if flow.response is None and _has_body(flow.request):
            flow.request.stream = _Counter()

    def responseheaders(self, flow: Any) -> None:
        flow.response.stream = _Counter()

    def response(self, flow: Any) -> None:
        self._report(flow, flow.response.status_code, None)

    def error(self, flow: Any) -> None:
        self._report(flow, flow.response.status_code if flow.response else None, flow.error.msg)

    async def server_connect(self, data: Any) -> None:
        """The connection goes to the address vetted here, not to what a second lookup (DNS
        rebinding) might say."""
        address = data.server.address
        if address is None or tuple(address) == ("127.0.0.1", self.relay_port):
            return
        host, port = address[0], address[1]
        if rules.normalize_host(host) in self.resolve:
            data.server.address = self.resolve[rules.normalize_host(host)]
            return
        vetted, why = await self.vet(host, port)
        if why is not None:
            data.server.error = why
        else:
            data.server.address = (vetted, port)

    async def vet(self, host: str, port: int) -> tuple[str | None, str | None]:
        """(the address to connect to, None), or (None, why the host is out of bounds): one
        that resolves to a loopback, private or link-local address (the runner's machine, its
        network, cloud metadata) is, unless the egress config's [resolve] names it."""
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
        except OSError as e:
            return None, f"{host} does not resolve: {e}"
        addresses = [str(info[4][0]) for info in infos]
        for address in addresses:
            if not ipaddress.ip_address(address.split("%")[0]).is_global:
                return None, (
                    f"{host} resolves to {address}, which is not a public address: the gate "
                    "reaches only public ones (an egress config's [resolve] can name a mirror)"
                )
        return addresses[0], None

    def tcp_start(self, flow: Any) -> None:
        """A tunnel that is not HTTP: only to an allowed host, and never to an LLM host."""
        granted = self.owner(flow)
        host = flow.server_conn.address[0] if flow.server_conn.address else "?"
        allowed = granted is not None and rules.host_matches(host, granted.allow)
        verdict = rules.ALLOWED if allowed else rules.DENIED
        reason = "non-HTTP tunnel to an allowed host" if allowed else "non-HTTP tunnel refused"
        if granted is not None:
            self.reporter.send(
                _record(granted, time.time(), "CONNECT", host, "", None, 0, 0, verdict, reason)
            )
        if not allowed:
            flow.kill()

    def tls_failed_client(self, data: Any) -> None:
        granted = self._owner_of(data.context.client.peername)
        if granted is None:
            return
        host = data.context.client.sni or "?"
        reason = f"TLS with the client failed (does it trust the egress CA?): {data.conn.error}"
        self.reporter.send(
            _record(granted, time.time(), "CONNECT", host, "", None, 0, 0, rules.DENIED, reason)
        )

    def _report(self, flow: Any, status: int | None, error: str | None) -> None:
        granted: Pass | None = flow.metadata.get("rolltap_pass")
        decision: rules.Decision | None = flow.metadata.get("rolltap_decision")
        if granted is None or decision is None:
            return
        sent = flow.request.stream
        got = flow.response.stream if flow.response is not None else None
        request_bytes = _size(sent, flow.request)
        response_bytes = _size(got, flow.response) if flow.response is not None else 0
        reason = decision.reason if error is None else f"{decision.reason}; {error}"
        self.reporter.send(
            _record(
                granted,
                flow.metadata["rolltap_started"],
                flow.request.method,
                flow.metadata["rolltap_host"],
                flow.metadata["rolltap_path"],
                status,
                request_bytes,
                response_bytes,
                decision.verdict,
                reason,
            )
        )


def _has_body(request: Any) -> bool:
    """Stream only a request that has a body: mitmproxy 11 loses a kept-alive connection's
    sync after streaming an empty one."""
    headers = request.headers
    return "transfer-encoding" in headers or int(headers.get("content-length", "0") or 0) > 0


def _is_websocket(request: Any) -> bool:
    return str(request.headers.get("upgrade", "")).lower() == "websocket"


class _Counter:
    """A stream callable: passes chunks through as they arrive and counts their bytes."""

    def __init__(self) -> None:
        self.bytes = 0

    def __call__(self, data: bytes) -> bytes:
        self.bytes += len(data)
        return data


def _size(stream: object, message: Any) -> int:
    """Bytes of a body: counted as it streamed, else the buffered body (a refusal's)."""
    if isinstance(stream, _Counter):
        return stream.bytes
    return len(message.raw_content or b"")


def _record(
    granted: Pass,
    started: float,
    method: str,
    host: str,
    path: str,
    status: int | None,
    request_bytes: int,
    response_bytes: int,
    verdict: str,
    reason: str,
) -> dict[str, Any]:
    return {
        "event": "request",
        "rollout": granted.rollout,
        "time": started,
        "method": method,
        "host": host,
        "path": path[:2000],
        "status": status,
        "request_bytes": request_bytes,
        "response_bytes": response_bytes,
        "verdict": verdict,
        "reason": reason[:500],
    }


def _refusal(status: int, text: str) -> bytes:
    body = f"rolltap egress: {text}\n".encode()
    head = (
        f"HTTP/1.1 {status} Forbidden\r\ncontent-type: text/plain\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


async def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        await writer.drain()
    writer.close()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(BUFFER):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


async def _control_loop(gate: Gate) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        gate.control(json.loads(line))


async def main(config_path: str) -> None:
    from mitmproxy import options
    from mitmproxy.certs import CertStore
    from mitmproxy.tools.dump import DumpMaster

    config = json.loads(Path(config_path).read_text())
    reporter = Reporter()
    gate = Gate(config, reporter)
    confdir = Path(config["confdir"])
    CertStore.create_store(confdir, "mitmproxy", 2048, "rolltap", config.get("ca_name", "rolltap"))
    opts = options.Options(
        listen_host="127.0.0.1",
        listen_port=0,
        confdir=str(confdir),
        upstream_cert=False,
        ssl_verify_upstream_trusted_ca=config.get("upstream_ca"),
    )
    master = DumpMaster(opts, with_termlog=False, with_dumper=False)
    # Lazy: the upstream is reached only for a request the addon let through, never at CONNECT.
    opts.update(connection_strategy="lazy")
    master.addons.add(gate)
    running = asyncio.ensure_future(master.run())
    proxyserver = master.addons.get("proxyserver")
    while not proxyserver.listen_addrs():
        if running.done():
            running.result()
        await asyncio.sleep(0.01)
    gate.mitm_port = proxyserver.listen_addrs()[0][1]
    relay = await asyncio.start_server(gate.relay, "127.0.0.1", 0)
    gate.relay_port = relay.sockets[0].getsockname()[1]
    socket_path = Path(config["socket"])
    socket_path.unlink(missing_ok=True)
    server = await asyncio.start_unix_server(gate.accept, str(socket_path))
    if config.get("socket_group") is not None:
        os.chown(socket_path, -1, int(config["socket_group"]))
    socket_path.chmod(0o660)
    reporter.send({"event": "ready", "ca_cert": str(confdir / "mitmproxy-ca-cert.pem")})
    try:
        await _control_loop(gate)
    finally:
        server.close()
        relay.close()
        master.shutdown()
        await running
        socket_path.unlink(missing_ok=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
