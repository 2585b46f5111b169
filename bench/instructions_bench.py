"""Instructions per call: rolltap beside the bare capturing forwarder, counted by callgrind.

    python bench/instructions_bench.py [--calls 150] [--concurrency 1] [--stream]
        [--callgrind-out DIR]

Wall-clock CPU figures move with whatever else a shared machine runs; instruction counts do not.
Each server runs under `valgrind --tool=callgrind` with counting off; after a warm-up the bench
turns counting on, drives `--calls` calls (2,000-token prompts, 200-token answers, the fake
engine answering at once), turns it off and reads the total. Printed: user-space instructions
per call of `rolltap serve` (capture into SQLite) and of bench/reference_forwarder.py --capture,
and their ratio. Not counted: the kernel (socket and file syscalls) and the engine.
With --callgrind-out the dumps stay in DIR (forwarder.cg.*, rolltap.cg.*) for
`callgrind_annotate --inclusive=yes DIR/rolltap.cg.<pid>.1`.

Under callgrind a call takes ~50x longer, so rolltap's 2-second re-read of each rollout would
land once every few calls instead of once every thousand; rolltap runs here with that period
stretched past the measurement (as bench/journal_serve.py patches the store, a measurement
only). The re-read's own cost is a separate figure (docs/scale.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import proxy_bench as pb  # noqa: E402

SERVE = (
    "import sys; from rolltap.proxy.rollouts import Rollouts; "
    "Rollouts.__init__.__kwdefaults__['ttl'] = 1e9; "
    "from rolltap.cli.main import main; sys.argv = ['rolltap', *sys.argv[1:]]; main()"
)


@contextlib.contextmanager
def counted(cmd: list[str], port: int, out: Path) -> Iterator[int]:
    grind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    with pb.process([*grind, *cmd], f"http://127.0.0.1:{port}") as pid:
        deadline = time.monotonic() + 600  # starting under valgrind is slow
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.5)
        yield pid


def control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def total(out: Path) -> int:
    dumped = sorted(out.parent.glob(out.name + ".*"))[-1]
    totals = [line for line in dumped.read_text().splitlines() if line.startswith("totals:")]
    return int(totals[-1].split()[1])


async def drive(urls: list[str], stream: bool, calls: int) -> None:
    left = calls
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def client(url: str) -> None:
            nonlocal left
            while left > 0:
                left -= 1
                body = pb.body(stream, left)
                async with session.post(url, data=body) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")

        await asyncio.gather(*(client(u) for u in urls))


async def measure(name: str, cmd: list[str], port: int, args: argparse.Namespace, tmp: str) -> int:
    out = Path(args.callgrind_out or tmp) / f"{name}.cg"
    with counted(cmd, port, out) as pid:
        base = f"http://127.0.0.1:{port}"
        path = "/v1/chat/completions"
        if name == "rolltap":
            urls = await pb.rollout_urls(base, path, args.concurrency)
        else:
            urls = [base + path] * args.concurrency
        await drive(urls, args.stream, args.warmup)
        control(pid, "-z")
        control(pid, "-i", "on")
        await drive(urls, args.stream, args.calls)
        control(pid, "-i", "off")
        control(pid, "-d")
    return total(out) // args.calls


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--callgrind-out", type=Path, help="keep the callgrind dumps here")
    args = parser.parse_args()
    if args.callgrind_out:
        args.callgrind_out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        engine_port = pb.free_port()
        engine_cmd = [sys.executable, "-m", "tests.support.fake_vllm", "--port", str(engine_port)]
        engine_cmd += ["--reply-tokens", str(pb.ANSWER_TOKENS), "--token-delay-ms", "0"]
        engine = f"http://127.0.0.1:{engine_port}"
        with pb.process(engine_cmd, engine):
            port = pb.free_port()
            forwarder = [sys.executable, str(ROOT / "bench" / "reference_forwarder.py")]
            forwarder += ["--engine", engine, "--port", str(port), "--capture"]
            floor = await measure("forwarder", forwarder, port, args, tmp)
            port = pb.free_port()
            rolltap = [sys.executable, "-c", SERVE, "serve", "--backend", engine]
            rolltap += ["--db", f"sqlite:///{tmp}/bench.sqlite", "--port", str(port)]
            ours = await measure("rolltap", rolltap, port, args, tmp)
    kind = "streamed (200 chunks)" if args.stream else "non-streaming"
    print(f"instructions per {kind} call, {args.concurrency} client(s), {args.calls} calls:")
    print(f"  bare capturing forwarder  {floor:12,d}")
    print(f"  rolltap serve (SQLite)    {ours:12,d}   {ours / floor:5.2f} x the forwarder")


if __name__ == "__main__":
    asyncio.run(main())
