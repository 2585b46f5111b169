"""Verification: runs a task's tests in the sandbox the agent left and turns the reward file
into a Reward, reading it as Harbor does.

/logs/verifier/reward.json (an object of finite numbers) wins over /logs/verifier/reward.txt (one
float, read as {"reward": x}).

Before test.sh runs, nothing of the agent is left to interfere: every process the task's setup or
the agent started is killed (Sandbox.reap: a daemon looping on reward.txt, however it detached),
and /logs/verifier and /tests are replaced by new empty directories owned by the verifier's user
(a planted reward.json, a test.sh of the agent's, or a link in their place are gone). What the
agent changed in the workdir stays: that is what the tests judge.

Failures are typed:

VerifyError
 ├── VerifierTimeout        test.sh ran past [verifier] timeout_sec
 └── RewardError            the reward file is unusable
      ├── RewardFileNotFound   neither file exists          (Harbor: RewardFileNotFoundError)
      ├── RewardFileEmpty      the file has zero bytes      (Harbor: RewardFileEmptyError)
      └── RewardParseError     not a number / NaN / inf / not an object of numbers
                                                            (Harbor: VerifierOutputParseError)
Unlike Harbor, NaN and infinities are errors rather than rewards.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .sandboxes.base import ExecResult, Sandbox
from .sandboxes.provision import put_script
from .tasks import Task

__all__ = [
    "Reward",
    "RewardError",
    "RewardFileEmpty",
    "RewardFileNotFound",
    "RewardParseError",
    "Verification",
    "VerifierTimeout",
    "VerifyError",
    "parse_reward",
    "verify",
]

REWARD_JSON = "reward.json"
REWARD_TXT = "reward.txt"
TEST_OUTPUT = "test-stdout.txt"


class VerifyError(Exception):
    pass


class VerifierTimeout(VerifyError):
    def __init__(self, message: str, result: ExecResult) -> None:
        super().__init__(message)
        self.result = result


class RewardError(VerifyError):
    pass


class RewardFileNotFound(RewardError):
    pass


class RewardFileEmpty(RewardError):
    pass


class RewardParseError(RewardError):
    pass


@dataclass(frozen=True)
class Reward:
    values: Mapping[str, float]

    @property
    def value(self) -> float:
        """The scalar reward: the "reward" entry, else the only entry, else the mean."""
        if "reward" in self.values:
            return self.values["reward"]
        return sum(self.values.values()) / len(self.values)


@dataclass(frozen=True)
class Verification:
    """What running the task's verifier found: its reward, and test.sh's run."""

    reward: Reward
    result: ExecResult
    """test.sh's exit status and output."""


def parse_reward(verifier_dir: Path) -> Reward:
    """The reward in a copy of /logs/verifier."""
    json_path, txt_path = verifier_dir / REWARD_JSON, verifier_dir / REWARD_TXT
    if _present(json_path):
        return Reward(_parse_json(_read(json_path), json_path))
    if _present(txt_path):
        return Reward({"reward": _parse_txt(_read(txt_path), txt_path)})
    raise RewardFileNotFound(f"no {REWARD_JSON} or {REWARD_TXT} in {verifier_dir}")


async def verify(
    sandbox: Sandbox, task: Task, out_dir: Path, *, log: Path | None = None
) -> Verification:
    """Kills what the agent left running, copies the tests into a fresh /tests, runs test.sh in
    the workdir with a fresh /logs/verifier, copies that into out_dir and reads the reward
    there. test.sh's output goes to `log`, by default out_dir/test-stdout.txt."""
    out_dir.mkdir(parents=True, exist_ok=True)
    await sandbox.reap()
    # What an unprivileged agent was given (docker) goes back to the verifier's user.
    await sandbox.hand_over(task.verifier_user)
    await sandbox.fresh_dir("/logs/verifier", user=task.verifier_user)
    await sandbox.fresh_dir("/tests")
    if task.tests_dir is not None:
        await sandbox.put(task.tests_dir, "/tests")
    elif task.test_script is not None:
        await put_script(sandbox, "/tests/test.sh", task.test_script)
    else:
        raise ValueError(f"{task.id}: the task has no tests")
    result = await sandbox.exec(
        ["bash", "/tests/test.sh"],
        env=task.verifier_env,
        timeout=task.verifier_timeout_sec,
        user=task.verifier_user,
        log=log or out_dir / TEST_OUTPUT,
        proxy=False,
    )
    if result.timed_out:
        raise VerifierTimeout(
            f"{task.id}: test.sh ran past {task.verifier_timeout_sec:g} s", result
        )
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "verifier"
        await sandbox.get("/logs/verifier", copy)
        has_file = _present(copy / REWARD_JSON) or _present(copy / REWARD_TXT)
        if task.reward_from_exit_code and not has_file:
            reward = Reward({"reward": 1.0 if result.exit_code == 0 else 0.0})
        else:
            reward = parse_reward(copy)
        shutil.copytree(copy, out_dir, symlinks=True, dirs_exist_ok=True)
    return Verification(reward, result)


def _present(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _read(path: Path) -> str:
    if path.is_symlink() or not path.is_file():
        raise RewardParseError(f"{path} is not a regular file")
    if path.stat().st_size == 0:
        raise RewardFileEmpty(f"{path} is empty")
    try:
        return path.read_text()
    except UnicodeDecodeError as e:
        raise RewardParseError(f"{path} is not UTF-8 text") from e


def _parse_txt(text: str, path: Path) -> float:
    try:
        value = float(text)
    except ValueError as e:
        raise RewardParseError(f"{path} does not hold one number") from e
    if not math.isfinite(value):
        raise RewardParseError(f"{path} holds {value}, not a finite number")
    return value


def _parse_json(text: str, path: Path) -> dict[str, float]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise RewardParseError(f"{path} is not valid JSON: {e.msg}") from e
    if not isinstance(obj, dict) or not obj:
        raise RewardParseError(f"{path} must hold a non-empty JSON object")
    values = {}
    for key, value in obj.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RewardParseError(f"{path}: {key!r} is not a number")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise RewardParseError(f"{path}: {key!r} is {value}, not a finite number")
        values[key] = number
    return values
