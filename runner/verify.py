"""Verification: runs a task's tests in the sandbox it is given (runner/grading.py: a fresh one
holding the agent's workdir, or the agent's own) and turns the reward file into a Reward, reading
it as Harbor does.

/logs/verifier/reward.json (an object of finite numbers) wins over /logs/verifier/reward.txt (one
float, read as {"reward": x}).

What the verifier guarantees, in every kind, when test.sh starts (tests/runner/
test_reward_hacking.py and test_reward_integrity.py try each as an agent would):

- No process of the agent is alive: every process the task's setup or the agent started is
  killed (Sandbox.reap: a daemon that waits for the verifier, however it detached).
- The tests are the task's: /tests and /logs/verifier are new empty directories owned by the
  verifier's user (a planted reward.json, a test.sh of the agent's, or a link in their place are
  gone), and /tests holds the task's tests/ again. In the workdir, the task's own test files
  (`keep_tests`, taken after the task's setup and before the agent, kept on the host) are put
  back as the setup left them: test directories (`tests/`, `test/`) whole, `conftest.py`,
  `test_*.py`, pytest's and tox's configuration, and pytest's part of pyproject.toml and
  setup.cfg; a conftest.py, pytest configuration or plugin entry point the agent added is
  removed (runner/sandboxes/pristine.py says exactly what counts). The list of what was put
  back or removed is `Verification.restored`, and restored.txt beside the reward.
- Python starts as the task made it: test.sh runs with PYTHONNOUSERSITE=1 (no user site: a .pth
  file or usercustomize.py in HOME's site-packages is not read; a task's [verifier] env may set
  PYTHONNOUSERSITE = "" to read it), and a sitecustomize.py or usercustomize.py the agent put in
  the workdir (which a test.sh's PYTHONPATH would have Python run first) is removed, as is a
  module it added at the top of the workdir (or of its src/) named like a test runner's (a
  pytest.py there is what `python -m pytest` runs). The verifier's environment is the task's
  [verifier] env over the sandbox's, never the agent's.

What the agent changed elsewhere in the workdir stays: that is what the tests judge, and the code
the tests import runs in their process, as in Harbor (a task's tests should not take that code's
word for their outcome). Not guarded: a Python environment inside the workdir (a venv there is
the agent's to change, its test runner included), the workdir's .git (its hooks and config run
with a test.sh's git commands), and, where the task grades in the agent's own sandbox, what the
agent changed outside the workdir (in docker, as a root agent, the image itself).

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
import secrets
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .sandboxes.base import ExecResult, Sandbox
from .sandboxes.errors import SandboxExecError
from .sandboxes.provision import ROOT, put_script
from .tasks import Task

__all__ = [
    "KeptTests",
    "Reward",
    "RewardError",
    "RewardFileEmpty",
    "RewardFileNotFound",
    "RewardParseError",
    "Verification",
    "VerifierTimeout",
    "VerifyError",
    "keep_tests",
    "parse_reward",
    "verify",
]

REWARD_JSON = "reward.json"
REWARD_TXT = "reward.txt"
TEST_OUTPUT = "test-stdout.txt"
RESTORED = "restored.txt"
"""What the verifier put back in the workdir or removed from it, one line each (when any)."""
PRISTINE = Path(__file__).with_name("sandboxes") / "pristine.py"
STAGE = "/logs/.rolltap-pristine"
"""Where pristine.py and its files stay while it runs (a path every kind maps, /logs)."""
VERIFIER_ENV = {"PYTHONNOUSERSITE": "1"}
"""Under the task's [verifier] env: Python reads no user site (HOME's site-packages)."""


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
    restored: tuple[str, ...] = ()
    """What was put back in the workdir (`restored tests/test_x.py`) or removed from it
    (`removed tests/conftest.py`) before test.sh ran."""


@dataclass(frozen=True)
class KeptTests:
    """The workdir's test files as the task's setup left them, in a host directory out of the
    agent's reach (`keep_tests`): manifest.json and tree/ (runner/sandboxes/pristine.py)."""

    dir: Path


def parse_reward(verifier_dir: Path) -> Reward:
    """The reward in a copy of /logs/verifier."""
    json_path, txt_path = verifier_dir / REWARD_JSON, verifier_dir / REWARD_TXT
    if _present(json_path):
        return Reward(_parse_json(_read(json_path), json_path))
    if _present(txt_path):
        return Reward({"reward": _parse_txt(_read(txt_path), txt_path)})
    raise RewardFileNotFound(f"no {REWARD_JSON} or {REWARD_TXT} in {verifier_dir}")


async def keep_tests(sandbox: Sandbox, task: Task, into: Path) -> KeptTests:
    """Copies the workdir's test files to `into` (a new host directory) as they are now: after
    the task's setup, before the agent runs. `verify(..., kept=)` puts them back."""
    # A new path below /logs, made by the copy: no agent ran yet to plant anything on the way.
    stage = f"{STAGE}-keep-{secrets.token_hex(8)}"
    try:
        await sandbox.put(PRISTINE, f"{stage}/{PRISTINE.name}")
        await _pristine(sandbox, task, "keep", stage, ROOT, task.environment.build_timeout_sec)
        await sandbox.get(stage, into)
    finally:
        await sandbox.exec(["rm", "-rf", stage], user=ROOT, timeout=60, proxy=False)
    manifest = json.loads((into / "manifest.json").read_text())
    for rel in manifest["unreadable"]:
        # Unreadable to the sandbox's root (docker's has no capability): the kind's own copy.
        target = into / "tree" / rel
        if target.is_dir():
            shutil.rmtree(target)
        await sandbox.get(f"{sandbox.workdir.rstrip('/')}/{rel}", target)
    return KeptTests(into)


async def verify(
    sandbox: Sandbox,
    task: Task,
    out_dir: Path,
    *,
    log: Path | None = None,
    kept: KeptTests | None = None,
) -> Verification:
    """Kills what the agent left running, puts the workdir's test files back as `kept` holds
    them (without it, a caller that ran no agent, nothing there is put back), copies the tests
    into a fresh /tests, runs test.sh in the workdir with a fresh /logs/verifier, copies that
    into out_dir and reads the reward there. test.sh's output goes to `log`, by default
    out_dir/test-stdout.txt."""
    out_dir.mkdir(parents=True, exist_ok=True)
    await sandbox.reap()
    # What an unprivileged agent was given (docker) goes back to the verifier's user.
    await sandbox.hand_over(task.verifier_user)
    restored = () if kept is None else await _restore_tests(sandbox, task, kept)
    if restored:
        (out_dir / RESTORED).write_text("".join(f"{line}\n" for line in restored))
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
        env={**VERIFIER_ENV, **task.verifier_env},
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
    return Verification(reward, result, restored)


async def _restore_tests(sandbox: Sandbox, task: Task, kept: KeptTests) -> tuple[str, ...]:
    """Puts the kept test files back in the workdir, as the verifier's user (it owns the
    workdir again); what it changed, one line each. The agent is dead: nothing can plant
    anything at a new random path below /logs (its own to write in docker only as root)."""
    shutil.copy(PRISTINE, kept.dir / PRISTINE.name)
    stage = f"{STAGE}-restore-{secrets.token_hex(8)}"
    user = task.verifier_user or ROOT
    removed = False  # pristine.py removes the stage when done, if its user may
    try:
        await sandbox.put(kept.dir, stage)
        done = await _pristine(sandbox, task, "restore", stage, user, task.verifier_timeout_sec)
        removed = user in (ROOT, "root", "0:0", "root:root")
    finally:
        if not removed:
            await sandbox.exec(["rm", "-rf", stage], user=ROOT, timeout=60, proxy=False)
    try:
        changes = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as e:
        raise VerifyError(f"{task.id}: restoring the task's test files said {done.stdout!r}") from e
    return tuple(str(c) for c in changes)


async def _pristine(
    sandbox: Sandbox, task: Task, mode: str, stage: str, user: str, timeout: float
) -> ExecResult:
    """Runs pristine.py (keep or restore) on the workdir, with the stage directory, isolated from
    every PYTHON* variable, user site and the directories it runs in."""
    argv = ["python3", "-I", "-S", f"{stage}/{PRISTINE.name}", mode, sandbox.workdir, stage]
    done = await sandbox.exec(argv, user=user, timeout=timeout, proxy=False)
    if not done.ok:
        what = "timed out" if done.timed_out else f"exited with {done.exit_code}"
        raise SandboxExecError(
            f"{task.id}: {mode} the task's test files {what}: {done.stderr.strip()[-500:]}"
        )
    return done


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
