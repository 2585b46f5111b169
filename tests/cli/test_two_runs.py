"""Two `rolltap run` of one batch name at once, as two experiments on one machine start them:
against one store the second says in one line that the batch is being run (and the first
finishes every rollout); against two stores both finish. Neither leaves anything in the
temporary folder they share, where both keep their sandboxes."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.cli import ROLLTAP
from tests.support.sandboxes import searchable

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bwrap is not installed: run .ci/setup-bwrap"
)

# Each rollout lasts 10 s, so the two runs overlap even when a loaded machine takes seconds to
# start the second one.
TASKS = [
    {"id": f"t{i}", "instruction": "-", "test": "test -f done", "solution": "sleep 10; touch done"}
    for i in range(3)
]


def _start(cwd: Path, tmp: Path, store: str, *more: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "XDG_DATA_HOME": str(cwd / "data"),
        "HOME": str(cwd),
        "TMPDIR": str(tmp),
    }
    env.pop("ROLLTAP_DB", None)
    args = ["run", "tasks.jsonl", "--harness", "oracle", "--sandbox", "bwrap", "-c", "3"]
    return subprocess.Popen(
        [ROLLTAP, *args, "--batch", "same-twice", "--db", store, *more],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_running(run: subprocess.Popen[str], path: Path, timeout: float = 120) -> None:
    """Until the first run has rollouts under way (its lease taken, its sandboxes made)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "running" in _statuses(path):
            return
        if run.poll() is not None:
            raise AssertionError(f"the first run ended early: {run.communicate()}")
        time.sleep(0.1)
    raise AssertionError(f"no rollout of {path} started running")


def _statuses(path: Path) -> list[str]:
    if not path.exists():
        return []
    try:
        with sqlite3.connect(path) as conn:
            return sorted(r[0] for r in conn.execute("SELECT status FROM rollout"))
    except sqlite3.OperationalError:
        return []


def _left_in(tmp: Path) -> list[str]:
    """What the runs left in the temporary folder: any file, socket or link (folders that are
    empty are the sandboxes' roots, shared by every run)."""
    return sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if not p.is_dir())


@pytest.fixture
def tmp(tmp_path: Path) -> Iterator[Path]:
    """The runs' TMPDIR: one the sandbox user can search (pytest's own folders are 0700)."""
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    shared = searchable(tmp_path)
    yield shared
    shutil.rmtree(shared, ignore_errors=True)


@dataclass(frozen=True)
class Ran:
    pid: int
    returncode: int
    stdout: str
    stderr: str


def _two_runs(
    cwd: Path, tmp: Path, first_store: Path, second_store: Path, *more: str
) -> tuple[Ran, Ran]:
    """The first run, then (once its rollouts run) the second with `more` flags; both to
    their end."""
    runs = [_start(cwd, tmp, f"sqlite:///{first_store}")]
    try:
        _wait_running(runs[0], first_store)
        runs.append(_start(cwd, tmp, f"sqlite:///{second_store}", *more))
        second = runs[1].communicate(timeout=300)
        first = runs[0].communicate(timeout=300)
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
    return Ran(runs[0].pid, runs[0].returncode, *first), Ran(
        runs[1].pid, runs[1].returncode, *second
    )


def test_a_second_run_of_a_batch_being_run_says_so_in_one_line(tmp_path: Path, tmp: Path) -> None:
    store = tmp_path / "s.sqlite"
    first, second = _two_runs(tmp_path, tmp, store, store)

    assert second.returncode == 1
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert lines[0].startswith(f"Error: batch same-twice is being run by pid {first.pid} on ")
    assert lines[0].endswith(": wait for it (--wait), or give another --batch name"), lines[0]
    assert first.returncode == 0, first.stdout + first.stderr
    # The refused run touched nothing: three rollouts, all finished by the first, none stuck.
    assert _statuses(store) == ["finished"] * 3
    with sqlite3.connect(store) as conn:
        assert conn.execute("SELECT count(*) FROM batch_lease").fetchone() == (0,)
        rewards = [r[0] for r in conn.execute("SELECT reward FROM rollout")]
    assert rewards == [1.0] * 3
    assert _left_in(tmp) == []


def test_a_second_run_with_wait_resumes_after_the_first(tmp_path: Path, tmp: Path) -> None:
    store = tmp_path / "s.sqlite"
    first, second = _two_runs(tmp_path, tmp, store, store, "--wait")

    assert first.returncode == 0
    assert second.returncode == 0, second.stderr
    assert "waiting: batch same-twice is being run by pid" in second.stdout + second.stderr
    assert "all 3 rollouts already finished; nothing to run" in second.stdout
    assert _statuses(store) == ["finished"] * 3
    assert _left_in(tmp) == []


def test_one_batch_name_on_two_stores_runs_twice(tmp_path: Path, tmp: Path) -> None:
    one, two = tmp_path / "one.sqlite", tmp_path / "two.sqlite"
    first, second = _two_runs(tmp_path, tmp, one, two)

    assert first.returncode == 0, first.stdout + first.stderr
    assert second.returncode == 0, second.stdout + second.stderr
    assert _statuses(one) == ["finished"] * 3
    assert _statuses(two) == ["finished"] * 3
    for store in (one, two):
        with sqlite3.connect(store) as conn:
            assert [r[0] for r in conn.execute("SELECT reward FROM rollout")] == [1.0] * 3
    assert _left_in(tmp) == []
