"""What a resume runs again, through `rolltap run` as a user runs it: a rollout the machine
ended (a harness that crashed) is rerun; one with a verdict on the agent (a test that failed, an
agent out of time) is kept; `--retry-failed` also reruns every one that did not finish."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.support.cli import rolltap

TASKS = [
    {"id": "judged", "instruction": "-", "test": "false", "solution": "true"},
    {"id": "crashed", "instruction": "-", "test": "test -f done", "solution": "exit 3"},
    {"id": "late", "instruction": "-", "test": "true", "solution": "sleep 30",
     "agent_timeout_sec": 1},
    {"id": "passes", "instruction": "-", "test": "test -f done", "solution": "touch done"},
]  # fmt: skip


def _attempts(store: Path) -> dict[str, list[str]]:
    """Each task's attempts' statuses, oldest first."""
    with sqlite3.connect(store) as conn:
        rows = conn.execute("SELECT task_id, status FROM rollout ORDER BY attempt").fetchall()
    found: dict[str, list[str]] = {}
    for task, status in rows:
        found.setdefault(task, []).append(status)
    return found


def test_a_resume_reruns_what_the_machine_ended_and_keeps_verdicts(tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    run = ["run", "tasks.jsonl", "--harness", "oracle", "--sandbox", "local", "--batch", "b"]
    run += ["--db", "s.sqlite"]
    first = rolltap(tmp_path, *run)
    # The oracle's run exits 1 while any task's reference solution fails it.
    assert first.returncode == 1, first.stderr
    store = tmp_path / "s.sqlite"
    assert _attempts(store) == {
        "judged": ["finished"],
        "crashed": ["failed"],
        "late": ["timed_out"],
        "passes": ["finished"],
    }

    resumed = rolltap(tmp_path, *run)
    assert resumed.returncode == 1, resumed.stderr
    assert "resuming batch b: 3 of 4 rollouts already finished, 1 to run" in resumed.stdout
    # The crash judged the harness, not the agent: it ran again (a new attempt, the old kept).
    assert _attempts(store) == {
        "judged": ["finished"],
        "crashed": ["failed", "failed"],
        "late": ["timed_out"],
        "passes": ["finished"],
    }

    retried = rolltap(tmp_path, *run, "--retry-failed")
    assert retried.returncode == 1, retried.stderr
    assert "resuming batch b: 2 of 4 rollouts already finished, 2 to run" in retried.stdout
    assert _attempts(store) == {
        "judged": ["finished"],
        "crashed": ["failed", "failed", "failed"],
        "late": ["timed_out", "timed_out"],
        "passes": ["finished"],
    }
