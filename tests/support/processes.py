"""The fake engine and `rolltap serve` as processes of their own, for tests that kill them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    url: str
    output: Path

    def kill(self) -> None:
        """SIGKILL: no handler runs, nothing is flushed or drained."""
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=30)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self) -> str:
        return self.output.read_text(errors="replace")[-3000:]

    async def ready(self, path: str, timeout: float = 120.0) -> None:
        """Wait until GET `path` answers 200 (the process must stay alive meanwhile)."""
        deadline = asyncio.get_running_loop().time() + timeout
        async with aiohttp.ClientSession() as session:
            while True:
                if self.popen.poll() is not None:
                    raise AssertionError(f"{self.name} exited:\n{self.tail()}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(self.url + path) as resp:
                        if resp.status == 200:
                            return
                if asyncio.get_running_loop().time() > deadline:
                    raise AssertionError(f"{self.name} not ready in {timeout} s:\n{self.tail()}")
                await asyncio.sleep(0.1)


def _start(name: str, args: list[str], port: int, workdir: Path) -> Child:
    output = workdir / f"{name}-{port}.log"
    with output.open("ab") as log:
        popen = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Child(name, popen, f"http://127.0.0.1:{port}", output)


def start_fake_engine(
    workdir: Path, port: int, log: Path, *, token_delay_ms: float, reply_tokens: int
) -> Child:
    """tests/support/fake_vllm.py serving on `port`, logging the request ids it sees to `log`."""
    args = ["-m", "tests.support.fake_vllm", "--port", str(port), "--log", str(log)]
    args += ["--token-delay-ms", str(token_delay_ms), "--reply-tokens", str(reply_tokens)]
    return _start("engine", args, port, workdir)


def start_serve(
    workdir: Path, port: int, db_url: str, *backends: str, options: Sequence[str] = ()
) -> Child:
    """`rolltap serve` on a store, in front of `backends`, with more `options`."""
    args = ["-m", "rolltap.cli.main", "serve", "--db", db_url, "--port", str(port), *options]
    for backend in backends:
        args += ["--backend", backend]
    return _start("proxy", args, port, workdir)


@contextlib.contextmanager
def reaped(*children: Child) -> Iterator[list[Child]]:
    """Children stopped on the way out, and any started meanwhile (append to the list)."""
    started = list(children)
    try:
        yield started
    finally:
        for child in reversed(started):
            child.stop()
