"""`rolltap run`'s output explains itself: a line per finished rollout where there is no
terminal (a log, CI), why each rollout fell short, and `rolltap show` with the same last lines."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support.cli import rolltap

TASKS = [
    {"id": "good", "instruction": "-", "test": "true", "solution": "true"},
    {
        "id": "bad",
        "instruction": "-",
        "test": 'echo "checking hello.txt"; echo "FAIL: hello.txt is missing"; exit 1',
        "solution": "true",
    },
]


def test_a_batch_says_what_happened_to_each_rollout_and_why(tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    ran = rolltap(
        tmp_path,
        *("run", "tasks.jsonl", "--harness", "oracle", "--sandbox", "local", "-c", "1"),
        *("--db", "s.sqlite", "--batch", "b"),
    )
    # The oracle's verdict: a task whose own solution is not rewarded fails the run.
    assert ran.returncode == 1, ran.stderr
    out = ran.stdout
    finished = re.findall(
        r"^\[(\d)/2\] (\w+)#0 finished, reward (\d) \(\w+\)(?: in \d+ s)?(.*)$", out, re.M
    )
    assert sorted(finished) == [
        ("1", "good", "1", ""),
        ("2", "bad", "0", ": FAIL: hello.txt is missing"),
    ] or sorted(finished) == [
        ("1", "bad", "0", ": FAIL: hello.txt is missing"),
        ("2", "good", "1", ""),
    ]
    why = out[out.index("why 1 rollout fell short") :]
    assert "bad#0 finished, reward 0 (failed)" in why
    assert "harness:  ended finished\n" in why
    assert "verifier: FAIL: hello.txt is missing" in why
    rollout = re.search(r"show:\s+rolltap show (\w+) --db s.sqlite$", why, re.M).group(1)  # type: ignore[union-attr]
    logs = Path(re.search(r"logs:\s+(\S+)", why).group(1))  # type: ignore[union-attr]
    assert logs.is_relative_to(tmp_path / "data")
    assert (logs / "verifier").is_dir()

    shown = rolltap(tmp_path, "show", rollout, "--db", "s.sqlite")
    assert shown.returncode == 0, shown.stderr
    assert (
        "verifier output (last lines)\n    checking hello.txt\n    FAIL: hello.txt is missing\n"
        in (shown.stdout)
    )
    assert f"logs {logs}" in shown.stdout
