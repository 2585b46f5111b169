"""Pipes loopback TCP connections inside a sandbox to the proxy's unix socket (stdlib only).

    python3 -I -S forwarder.py --listen 127.0.0.1:PORT --unix SOCKET [--ready-file F]
        [--connect-timeout SEC] [--egress 127.0.0.1:PORT2 --egress-unix SOCKET2
        --egress-token TOKEN] [-- CMD...]

With --egress, a second loopback port is piped to the egress gate's socket (runner/egress),
each connection opened with `ROLLTAP-EGRESS TOKEN`: the gate's only way to tell sandboxes apart.

The listening socket is bound before anything else, so a client never races the server. With
CMD, this process becomes CMD (keeping its pid, stdio and exit status) and a child process
serves; the server exits when CMD's process does. Without CMD it serves until killed. Runs on
any Python from 3.7 (task images bring their own), so it uses nothing newer.
"""

from __future__ import annotations

import _socket  # not `socket`: see why below, at the second import block
import os
import sys

BUFFER = 1 << 16
BACKLOG = 4096
CONNECT_TIMEOUT_SEC = 10.0
USAGE = (
    "usage: forwarder.py --listen HOST:PORT --unix SOCKET [--ready-file F]"
    " [--connect-timeout SEC] [--egress HOST:PORT --egress-unix SOCKET --egress-token T]"
    " [-- CMD...]"
)
EGRESS_PREAMBLE = b"ROLLTAP-EGRESS "


class Options:
    def __init__(self, argv: list[str]) -> None:
        self.command: list[str] = []
        if "--" in argv:
            cut = argv.index("--")
            argv, self.command = argv[:cut], argv[cut + 1 :]
        opts = {argv[i]: argv[i + 1] for i in range(0, len(argv) - 1, 2)}
        if len(argv) % 2 or "--listen" not in opts or "--unix" not in opts:
            raise SystemExit(USAGE)
        host, _, port = opts["--listen"].rpartition(":")
        self.host, self.port = host, int(port)
        self.unix_path = opts["--unix"]
        self.ready_file = opts.get("--ready-file")
        self.connect_timeout = float(opts.get("--connect-timeout", CONNECT_TIMEOUT_SEC))
        self.egress: tuple[str, int, str, str] | None = None
        if "--egress" in opts:
            if "--egress-unix" not in opts or "--egress-token" not in opts:
                raise SystemExit(USAGE)
            e_host, _, e_port = opts["--egress"].rpartition(":")
            self.egress = (e_host, int(e_port), opts["--egress-unix"], opts["--egress-token"])


def _listen(host: str, port: int) -> _socket.socket:
    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    return sock


def start(argv: list[str]) -> tuple[list[_socket.socket], Options, int]:
    """Binds, then with a command forks and execs it: returns (in the serving process only) the
    listening sockets (the proxy's, then the egress one), the options and the pid whose exit
    ends the serving."""
    options = Options(argv)
    socks = [_listen(options.host, options.port)]
    if options.egress is not None:
        socks.append(_listen(options.egress[0], options.egress[1]))
    if options.ready_file:
        with open(options.ready_file, "w") as f:
            f.write(f"{options.port}\n")
    parent = os.getpid()
    if not options.command:
        return socks, options, os.getppid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        return socks, options, parent
    for sock in socks:
        sock.close()
    try:
        os.execvp(options.command[0], options.command)
    except OSError as e:
        sys.stderr.write(f"{options.command[0]}: {e.strerror}\n")
    os._exit(127)


def first_client(socks: list[_socket.socket], watched: int) -> bool:
    """Waits, importing nothing, until a client connects to one of the listening sockets (True)
    or the watched process is gone (False)."""
    import select  # a small C module (built into Debian's python3)

    while os.getppid() == watched:
        ready, _, _ = select.select(socks, [], [], 0.5)
        if ready:
            return True
    return False


if __name__ == "__main__":
    LISTENING, OPTIONS, WATCHED = start(sys.argv[1:])
    # Most commands never call the proxy (setup, tests, an oracle's solution): their serving
    # process ends without having loaded asyncio.
    if not first_client(LISTENING, WATCHED):
        os._exit(0)

# Every sandboxed command waits for start() to bind and exec it, and asyncio and socket take
# tens of milliseconds of CPU to import: only a serving process with a client imports them.
import asyncio  # noqa: E402
import socket  # noqa: E402


async def serve(
    sock: socket.socket,
    unix_path: str,
    connect_timeout: float = CONNECT_TIMEOUT_SEC,
    preamble: bytes = b"",
) -> None:
    """Serves connections on an already listening socket until cancelled; `preamble` is sent
    first on each connection to the unix socket."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await pipe_to_unix(reader, writer, unix_path, connect_timeout, preamble)

    server = await asyncio.start_server(handle, sock=sock)
    async with server:
        await server.serve_forever()


async def pipe_to_unix(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    unix_path: str,
    connect_timeout: float = CONNECT_TIMEOUT_SEC,
    preamble: bytes = b"",
) -> None:
    try:
        up_reader, up_writer = await _connect(unix_path, connect_timeout)
    except OSError:
        client_writer.close()
        return
    if preamble:
        up_writer.write(preamble)
    try:
        await asyncio.gather(_copy(client_reader, up_writer), _copy(up_reader, client_writer))
    finally:
        up_writer.close()
        client_writer.close()


async def _connect(
    unix_path: str, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connects, retrying while the server's backlog is full or while it restarts, until
    timeout. asyncio's own connect takes a unix socket's EAGAIN (full backlog) for "in
    progress" and hands back a socket that never connected, so connect here: on a unix socket
    a non-blocking connect either succeeds or fails at once."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.005
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(unix_path)
            return await asyncio.open_unix_connection(sock=sock)
        except OSError:
            sock.close()
            if loop.time() + delay > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.25)


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(BUFFER)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        # Half-close: the other direction may still be streaming (an SSE reply).
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        # One side went away: closing this writer ends the other direction's read too.
        writer.close()


async def _serve_while_alive(socks: list[socket.socket], options: Options, watched: int) -> None:
    servers = [serve(socks[0], options.unix_path, options.connect_timeout)]
    if options.egress is not None:
        preamble = EGRESS_PREAMBLE + options.egress[3].encode() + b"\n"
        servers.append(serve(socks[1], options.egress[2], options.connect_timeout, preamble))
    server = asyncio.ensure_future(asyncio.gather(*servers))
    while os.getppid() == watched and not server.done():
        await asyncio.sleep(0.5)
    server.cancel()


if __name__ == "__main__":
    listening = [socket.socket(fileno=s.detach()) for s in LISTENING]
    asyncio.run(_serve_while_alive(listening, OPTIONS, WATCHED))
