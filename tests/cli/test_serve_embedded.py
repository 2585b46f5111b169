"""`rolltap serve` on the embedded default, driven as a user would: examples/chat.py through it
with the openai SDK, then `rolltap show` of the recorded rollout, then SIGTERM with an answer
still being generated. Real model, real processes.

It runs from a folder holding a `rolltap/` package of its own (as the parent of a clone does),
which neither rolltap nor its engine process may import."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
ROLLTAP = str(Path(sys.executable).parent / "rolltap")
pytestmark = pytest.mark.model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_builtin_engine_then_chat_then_show(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'store.sqlite'}"
    port = _free_port()
    work = tmp_path / "work"
    (work / "rolltap").mkdir(parents=True)
    (work / "rolltap" / "__init__.py").write_text("raise ImportError('the cwd was imported')\n")
    flags = ["--drain-seconds", "1", "--engine-arg=--max-tokens-cap=300"]
    serve = subprocess.Popen(
        [ROLLTAP, "serve", "--db", db, "--port", str(port), *flags],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert serve.stdout is not None
        banner = []
        deadline = time.monotonic() + 300
        for line in serve.stdout:
            banner.append(line)
            if "rolltap proxy on" in line or time.monotonic() > deadline:
                break
        assert any("rolltap proxy on" in line for line in banner), "".join(banner)
        engine = next(line for line in serve.stdout if "backends:" in line).split()[-1]
        # Whether the plain model or an adapter answers is said before anything runs:
        # serve's built-in engine runs the plain model unless --adapter says otherwise.
        assert serve.stdout.readline() == "  adapter: none (the plain model)\n"
        with urllib.request.urlopen(f"{engine}/stats") as answer:
            settings = json.load(answer)["settings"]
        # rolltap's defaults for the built-in engine, then the user's --engine-arg over them.
        assert (settings["default_max_tokens"], settings["max_tokens_cap"]) == (256, 300)

        chat = subprocess.run(
            [sys.executable, "examples/chat.py", "--proxy", f"http://127.0.0.1:{port}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert chat.returncode == 0, chat.stderr
        rollout_id = re.search(r"rollout (\w+):", chat.stdout).group(1)  # type: ignore[union-attr]
        # The example's prompt is one the small model answers in sense, not in a loop of French.
        assert "Paris" in chat.stdout, chat.stdout
        assert "Rome" in chat.stdout, chat.stdout

        shown = subprocess.run(
            [ROLLTAP, "show", rollout_id, "--db", db],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert shown.returncode == 0, shown.stderr
        rows = [
            line.split() for line in shown.stdout.splitlines() if re.match(r"\s*\d+\s+chat", line)
        ]
        assert [r[0] for r in rows] == ["1", "2", "3"]
        assert all(r[2] == "ok" for r in rows)
        assert all("tokens" in " ".join(r) for r in rows)

        conversation = subprocess.run(
            [ROLLTAP, "show", rollout_id, "--db", db, "--conversation"],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert conversation.returncode == 0, conversation.stderr
        assert conversation.stdout.count("[user]") == 3
        assert conversation.stdout.count("answer\n[assistant]") == 3

        # SIGTERM mid-answer: the call gets --drain-seconds, then the engine stops generating.
        (engine_process,) = psutil.Process(serve.pid).children()
        in_flight = threading.Thread(target=_long_answer, args=(f"http://127.0.0.1:{port}",))
        in_flight.start()
        while _engine_stats(engine)["running"] == 0:
            time.sleep(0.05)
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(60) == 0
        said = serve.stdout.read()
        assert "stopping: waiting up to 1 s for 1 call(s) in flight" in said, said
        assert "stopping now: 1 call(s) still in flight end as failed" in said, said
        assert not engine_process.is_running()
        in_flight.join(30)
        with sqlite3.connect(tmp_path / "store.sqlite") as conn:
            (status, tokens), *_ = conn.execute(
                "SELECT status, completion_tokens FROM call ORDER BY received_at DESC"
            )
        assert status == "failed"
        assert tokens < 300
    finally:
        serve.terminate()
        serve.wait(30)


def _engine_stats(engine: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{engine}/stats") as answer:
        stats: dict[str, int] = json.load(answer)
    return stats


def _long_answer(proxy: str) -> None:
    """A whole (non-streaming) answer of 300 tokens (ignore_eos), in a rollout of its own."""
    create = urllib.request.Request(f"{proxy}/admin/rollouts", data=b"{}", method="POST")
    with urllib.request.urlopen(create) as answer:
        base_url = json.load(answer)["base_url"]
    body = {
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": 300,
        "ignore_eos": True,
    }
    call = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with contextlib.suppress(OSError):
        urllib.request.urlopen(call, timeout=120).read()
