"""What a new user runs into first, through the real `rolltap` command: a backend that is not
up, a port already taken, a batch of nothing, a batch resumed without saying so."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rolltap.store import NewRollout, RolloutStatus
from rolltap.store.events import Declared
from tests.cli.test_mistakes import one_line_error
from tests.support.cli import rolltap
from tests.support.processes import ROOT, free_port
from tests.support.stores import opened_store

README = ROOT / "README.md"


def _tasks(path: Path) -> Path:
    entry = {"id": "t", "instruction": "say hi", "test": "true", "solution": "true"}
    path.write_text(json.dumps(entry) + "\n")
    return path


@pytest.mark.parametrize("model", [[], ["--model", "m"]])
def test_run_against_a_backend_that_is_not_up_is_one_line(tmp_path: Path, model: list[str]) -> None:
    _tasks(tmp_path / "tasks.jsonl")
    backend = f"http://127.0.0.1:{free_port()}"
    result = rolltap(
        tmp_path,
        *("run", "tasks.jsonl", "--harness", "single-call", "--sandbox", "local"),
        *("--backend", backend, "--db", "s.sqlite", *model),
    )
    assert one_line_error(result) == (
        f"Error: --backend {backend}: nothing answers there (connection refused); "
        "start the engine first, or check the URL"
    )


def test_a_second_ui_on_a_taken_port_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = rolltap(tmp_path, "ui", "--port", str(port), "--db", "s.sqlite")
    assert one_line_error(result) == (
        f"Error: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(choose another with --port)"
    )


@pytest.mark.parametrize("flag", ["-n", "-c"])
def test_run_refuses_zero_samples_or_harnesses(tmp_path: Path, flag: str) -> None:
    _tasks(tmp_path / "tasks.jsonl")
    args = ("run", "tasks.jsonl", "--harness", "oracle", "--sandbox", "local", "--db", "s.sqlite")
    result = rolltap(tmp_path, *args, flag, "0")
    assert result.returncode == 2, result.stdout
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"Error: Invalid value for '{flag}'")
    assert "0 is not in the range x>=1" in result.stderr
    assert not (tmp_path / "s.sqlite").exists()


def test_a_resumed_batch_says_it_resumes(tmp_path: Path) -> None:
    _tasks(tmp_path / "tasks.jsonl")
    db = f"sqlite:///{tmp_path / 's.sqlite'}"

    async def interrupted() -> None:
        # What a killed run leaves: the batch's rollout, never finished.
        async with opened_store(db) as store:
            created = await store.create_rollout(
                NewRollout(batch_id="b1", task_id="t", sample_index=0, harness="oracle")
            )
            await store.report(created.id, Declared(RolloutStatus.RUNNING))

    asyncio.run(interrupted())
    common = ("run", "tasks.jsonl", "--harness", "oracle", "--sandbox", "local", "--db", db)
    resumed = rolltap(tmp_path, *common, "--batch", "b1", "-n", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming batch b1: 0 of 2 rollouts already finished, 2 to run" in resumed.stdout
    again = rolltap(tmp_path, *common, "--batch", "b1", "-n", "2")
    assert again.returncode == 0, again.stderr
    assert "batch b1: all 2 rollouts already finished; nothing to run" in again.stdout
    fresh = rolltap(tmp_path, *common, "--batch", "b2")
    assert fresh.returncode == 0, fresh.stderr
    assert "resuming" not in fresh.stdout


def test_the_chat_example_without_the_openai_sdk_says_what_to_install(tmp_path: Path) -> None:
    # What `pip install -e '.[engine]'` leaves: no openai package to import.
    absent = tmp_path / "without-openai" / "openai"
    absent.mkdir(parents=True)
    (absent / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'openai'\", name='openai')\n"
    )
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "chat.py")],
        env={**os.environ, "PYTHONPATH": str(absent.parent)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert one_line_error(result) == (
        "examples/chat.py talks to the proxy with the openai SDK, as a harness would: "
        "pip install openai"
    )
    using_it = (ROOT / "docs" / "using.md").read_text()
    assert "`examples/chat.py`" in using_it
    assert "pip install openai" in using_it


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("seed", "'seed': give KEY=VALUE"),
        ("seed=x", "'seed=x': VALUE must be a number"),
        ("logit_bias=1", "sampling option 'logit_bias' is not supported"),
        ("temperature=-1", "'sampling' has a negative temperature"),
    ],
)
def test_a_bad_sampling_option_is_one_line_and_creates_nothing(
    tmp_path: Path, given: str, why: str
) -> None:
    _tasks(tmp_path / "tasks.jsonl")
    args = ("run", "tasks.jsonl", "--harness", "oracle", "--sandbox", "local", "--db", "s.sqlite")
    result = rolltap(tmp_path, *args, "--sampling", given)
    assert result.returncode == 2, result.stdout
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: Invalid value for --sampling:"), last
    assert why in last
    assert not (tmp_path / "s.sqlite").exists()
