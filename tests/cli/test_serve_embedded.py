"""`rolltap serve` on the embedded default, driven as a user would: examples/chat.py through it
with the openai SDK, then `rolltap show` of the recorded rollout. Real model, real processes.

It runs from a folder holding a `rolltap/` package of its own (as the parent of a clone does),
which neither rolltap nor its engine process may import."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

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
    serve = subprocess.Popen(
        [ROLLTAP, "serve", "--db", db, "--port", str(port), "--engine-arg=--max-tokens-cap=300"],
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
    finally:
        serve.terminate()
        serve.wait(30)
