"""Reward files read as Harbor reads them, and verification in a real sandbox."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import pytest_asyncio

from rolltap.runner.sandboxes.base import SandboxProvider
from rolltap.runner.tasks import Task
from rolltap.runner.verify import (
    Reward,
    RewardFileEmpty,
    RewardFileNotFound,
    RewardParseError,
    VerifierTimeout,
    parse_reward,
    verify,
)
from tests.support.sandboxes import open_provider, plain_task, spec_for


def verifier_dir(tmp_path: Path, **files: str) -> Path:
    d = tmp_path / "verifier"
    d.mkdir()
    for name, text in files.items():
        (d / name.replace("_", ".")).write_text(text)
    return d


@pytest.mark.parametrize(
    ("files", "values"),
    [
        ({"reward_txt": "1"}, {"reward": 1.0}),
        ({"reward_txt": " 0.25 \n"}, {"reward": 0.25}),
        ({"reward_txt": "-1e0"}, {"reward": -1.0}),
        ({"reward_json": '{"reward": 1, "speed": 0.5}'}, {"reward": 1.0, "speed": 0.5}),
        ({"reward_json": '{"accuracy": 0.5}', "reward_txt": "1"}, {"accuracy": 0.5}),
    ],
)
def test_reward_files(tmp_path: Path, files: dict[str, str], values: dict[str, float]) -> None:
    assert parse_reward(verifier_dir(tmp_path, **files)).values == values


@pytest.mark.parametrize(
    ("files", "error"),
    [
        ({}, RewardFileNotFound),
        ({"other_txt": "1"}, RewardFileNotFound),
        ({"reward_txt": ""}, RewardFileEmpty),
        ({"reward_json": ""}, RewardFileEmpty),
        ({"reward_txt": "  \n"}, RewardParseError),
        ({"reward_txt": "pass"}, RewardParseError),
        ({"reward_txt": "1,0"}, RewardParseError),
        ({"reward_txt": "nan"}, RewardParseError),
        ({"reward_txt": "inf"}, RewardParseError),
        ({"reward_txt": "-Infinity"}, RewardParseError),
        ({"reward_json": "[1]"}, RewardParseError),
        ({"reward_json": "{}"}, RewardParseError),
        ({"reward_json": '{"reward": "1"}'}, RewardParseError),
        ({"reward_json": '{"reward": true}'}, RewardParseError),
        ({"reward_json": '{"reward": NaN}'}, RewardParseError),
        ({"reward_json": '{"reward": 1e999}'}, RewardParseError),
        ({"reward_json": '{"reward": 1' + "0" * 400 + "}"}, RewardParseError),
        ({"reward_json": "{bad"}, RewardParseError),
        # reward.json wins even when it is broken and reward.txt is fine
        ({"reward_json": "{bad", "reward_txt": "1"}, RewardParseError),
    ],
)
def test_unusable_reward_files_raise_typed_errors(
    tmp_path: Path, files: dict[str, str], error: type[Exception]
) -> None:
    with pytest.raises(error):
        parse_reward(verifier_dir(tmp_path, **files))


def test_a_symlinked_reward_file_is_not_followed(tmp_path: Path) -> None:
    d = verifier_dir(tmp_path)
    (tmp_path / "elsewhere").write_text("1")
    (d / "reward.txt").symlink_to(tmp_path / "elsewhere")

    with pytest.raises(RewardParseError, match="not a regular file"):
        parse_reward(d)


@pytest.mark.parametrize(
    ("values", "scalar"),
    [({"reward": 0.5, "x": 1.0}, 0.5), ({"accuracy": 0.25}, 0.25), ({"a": 1.0, "b": 0.0}, 0.5)],
)
def test_the_scalar_reward(values: dict[str, float], scalar: float) -> None:
    assert math.isclose(Reward(values).value, scalar)


@pytest_asyncio.fixture(params=["local", "bwrap"], loop_scope="function")
async def provider(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[SandboxProvider]:
    opened = await open_provider(request.param, tmp_path / "ws")
    yield opened
    await opened.close()


def task_with_tests(tmp_path: Path, test_sh: str, **changes: object) -> Task:
    tests = tmp_path / "task-tests"
    tests.mkdir(exist_ok=True)
    (tests / "test.sh").write_text(test_sh)
    (tests / "expected.txt").write_text("42\n")
    return replace(plain_task(), tests_dir=tests, **changes)  # type: ignore[arg-type]


async def test_tests_run_in_the_workdir_with_their_files_and_env(
    provider: SandboxProvider, tmp_path: Path
) -> None:
    test_sh = (
        'echo "checking in $PWD with $MODE"\n'
        "cmp -s answer.txt /tests/expected.txt && echo 1 > /logs/verifier/reward.txt"
        " || echo 0 > /logs/verifier/reward.txt\n"
        "echo details > /logs/verifier/notes.txt\n"
    )
    task = task_with_tests(tmp_path, test_sh, verifier_env={"MODE": "strict"})
    box = await provider.create(spec_for(task))
    try:
        await box.exec("echo 42 > answer.txt")
        verdict = await verify(box, task, tmp_path / "out")
    finally:
        await box.close()

    assert verdict.reward.value == 1.0
    assert verdict.result.ok
    assert (tmp_path / "out" / "reward.txt").read_text() == "1\n"
    assert (tmp_path / "out" / "notes.txt").read_text() == "details\n"
    assert (tmp_path / "out" / "test-stdout.txt").read_text().endswith("app with strict\n")


async def test_what_the_agent_planted_in_tests_and_logs_is_gone(
    provider: SandboxProvider, tmp_path: Path
) -> None:
    test_sh = (
        "if [ -e /tests/planted ] || [ -e /logs/verifier/old ]; then r=0; else r=1; fi\n"
        "echo $r > /logs/verifier/reward.txt\n"
    )
    task = task_with_tests(tmp_path, test_sh)
    box = await provider.create(spec_for(task))
    try:
        await box.exec("touch /logs/verifier/old /tests/planted")
        clean = await verify(box, task, tmp_path / "out")
        await box.exec("echo 1 > /logs/verifier/reward.txt")
        no_reward = replace(task, tests_dir=None, test_script="true", reward_from_exit_code=False)
        with pytest.raises(RewardFileNotFound):
            await verify(box, no_reward, tmp_path / "out2")
    finally:
        await box.close()

    assert clean.reward.value == 1.0


async def test_a_test_that_hangs_is_a_verifier_timeout(
    provider: SandboxProvider, tmp_path: Path
) -> None:
    task = task_with_tests(tmp_path, "sleep 600\n", verifier_timeout_sec=1.0)
    box = await provider.create(spec_for(task))
    try:
        with pytest.raises(VerifierTimeout) as caught:
            await verify(box, task, tmp_path / "out")
    finally:
        await box.close()

    assert caught.value.result.timed_out


@pytest.mark.parametrize(
    ("script", "reward"),
    [
        ("test -f done", 1.0),
        ("test -f missing", 0.0),
        ("echo 0.75 > /logs/verifier/reward.txt; exit 1", 0.75),
    ],
)
async def test_inline_tests_score_by_exit_status_unless_they_write_a_reward(
    provider: SandboxProvider, tmp_path: Path, script: str, reward: float
) -> None:
    task = replace(plain_task(), test_script=script, reward_from_exit_code=True)
    box = await provider.create(spec_for(task))
    try:
        await box.exec("touch done")
        verdict = await verify(box, task, tmp_path / "out")
    finally:
        await box.close()

    assert verdict.reward.value == reward
