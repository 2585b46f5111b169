"""The batch pipeline with a fake engine behind the real proxy and a shell harness, in real
sandboxes: rewards from the tasks' real tests, calls and tokens under each rollout, timeouts,
infrastructure retries, and resuming a batch whose runner was killed."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from rolltap.runner import run_batch
from rolltap.runner.grading import GRADING_SUFFIX
from rolltap.runner.plan import kept
from rolltap.runner.sandboxes.base import Sandbox, SandboxProvider, SandboxSpec
from rolltap.runner.sandboxes.errors import SandboxStartError
from rolltap.runner.summary import pass_at_k
from rolltap.runner.tasks import load_tasks
from rolltap.store import Capture, RolloutStatus, Store
from tests.support.fake_harness import ShellHarness, cleanup, shell_installation
from tests.support.proxy import fake_engine
from tests.support.sandboxes import provider_of
from tests.support.stores import opened_store

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "tasks"
SOLVES_HELLO = 'python3 "$ROLLTAP_ASK" "say hello" && echo hello > hello.txt'


@pytest.fixture
def tasks() -> list[Any]:
    """hello-file first: the tests that run one task run that one."""
    by_id = {t.id: t for t in load_tasks(EXAMPLES)}
    return [by_id["hello-file"], by_id["answer-42"]]


@pytest.fixture
async def engine_url() -> AsyncIterator[str]:
    async with fake_engine() as engine:
        yield engine.url


@pytest.fixture
def installed() -> Any:
    inst = shell_installation()
    yield inst
    cleanup(inst)


@pytest.mark.parametrize("kind", ["local", "bwrap", "docker"])
async def test_batch_rewards_calls_and_tokens(
    kind: str, tasks: list[Any], engine_url: str, store: Store, installed: Any, tmp_path: Path
) -> None:
    async with provider_of(kind, tmp_path / "boxes") as provider:
        result = await run_batch(
            tasks,
            harness=ShellHarness(SOLVES_HELLO),
            installed=installed,
            harness_from="host",
            sandbox=provider,
            samples=2,
            concurrency=2,
            backends=[engine_url],
            store=store,
            logs_root=tmp_path / "logs",
        )

    assert len(result.results) == 4
    rewards = {(r.task_id, r.sample_index): r.reward for r in result.results}
    # The script solves hello-file and not answer-42: the real tests say so.
    assert rewards == {
        ("hello-file", 0): 1.0,
        ("hello-file", 1): 1.0,
        ("answer-42", 0): 0.0,
        ("answer-42", 1): 0.0,
    }
    for r in result.results:
        assert r.status is RolloutStatus.SUCCEEDED
        (call,) = await store.calls(r.rollout_id)
        assert call.capture is Capture.TOKENS
        assert call.prompt_tokens > 0
        assert call.completion_tokens > 0
        assert (r.logs_dir / "verifier" / "reward.txt").is_file()
        view = await store.rollout(r.rollout_id)
        assert view.reward_details is not None
        assert view.reward_details["test_exit_code"] == 0
    by_task = {t.task_id: t for t in result.summary.tasks}
    assert (by_task["hello-file"].pass_at_1, by_task["answer-42"].pass_at_k) == (1.0, 0.0)
    assert result.summary.calls == 4


async def test_hanging_harness_is_killed_at_its_timeout_with_its_process_tree(
    tasks: list[Any], engine_url: str, store: Store, installed: Any, tmp_path: Path
) -> None:
    pidfile = tmp_path / "descendant.pid"
    script = f"(sleep 600 & echo $! > {pidfile}; wait) & sleep 600"
    async with provider_of("local", tmp_path / "boxes") as provider:
        result = await run_batch(
            tasks[:1],
            harness=ShellHarness(script),
            installed=installed,
            sandbox=provider,
            backends=[engine_url],
            store=store,
            timeout=2,
            logs_root=tmp_path / "logs",
        )

    (r,) = result.results
    assert r.status is RolloutStatus.TIMED_OUT
    assert r.reward == 0.0  # the verifier still ran on what the harness left
    pid = int(pidfile.read_text())
    for _ in range(50):
        if not _running(pid):
            break
        await asyncio.sleep(0.1)
    assert not _running(pid), "a descendant of the harness survived"


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan waits for PID 1 to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


class FlakyProvider:
    """A real provider whose first `failures` creates fail as a broken daemon's would."""

    def __init__(self, inner: SandboxProvider, failures: int, grader_failures: int = 0) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.failures = failures
        self.grader_failures = grader_failures
        self.attempts = 0
        self.graders = 0
        """Creates of the verifier's fresh sandbox (runner/grading.py), counted apart."""

    async def create(self, spec: SandboxSpec) -> Sandbox:
        if spec.rollout_id.endswith(GRADING_SUFFIX):
            self.graders += 1
            if self.graders <= self.grader_failures:
                raise SandboxStartError("the verifier's sandbox did not come up")
            return await self.inner.create(spec)
        self.attempts += 1
        if self.attempts <= self.failures:
            raise SandboxStartError("the sandbox did not come up")
        return await self.inner.create(spec)

    async def sweep(self, run_id: str) -> int:
        return await self.inner.sweep(run_id)

    async def close(self) -> None:
        await self.inner.close()


async def test_a_sandbox_that_fails_to_start_is_retried(
    tasks: list[Any], engine_url: str, store: Store, installed: Any, tmp_path: Path
) -> None:
    async with provider_of("local", tmp_path / "boxes") as real:
        flaky = FlakyProvider(real, failures=2)
        result = await run_batch(
            tasks[:1],
            harness=ShellHarness(SOLVES_HELLO),
            installed=installed,
            sandbox=flaky,
            backends=[engine_url],
            store=store,
            retries=2,
            logs_root=tmp_path / "logs",
        )

    (r,) = result.results
    assert (r.status, r.reward, flaky.attempts, flaky.graders) == (
        RolloutStatus.SUCCEEDED,
        1.0,
        3,
        1,
    )
    # No call was made before the sandbox came up: the same rollout was used throughout.
    assert len(await store.rollouts()) == 1


async def test_a_verifier_sandbox_that_fails_to_start_leaves_the_rollout_unjudged(
    tasks: list[Any], engine_url: str, store: Store, installed: Any, tmp_path: Path
) -> None:
    async with provider_of("local", tmp_path / "boxes") as real:
        flaky = FlakyProvider(real, failures=0, grader_failures=1)
        result = await run_batch(
            tasks[:1],
            harness=ShellHarness(SOLVES_HELLO),
            installed=installed,
            sandbox=flaky,
            backends=[engine_url],
            store=store,
            logs_root=tmp_path / "logs",
        )

    (r,) = result.results
    # No verdict on the agent: the machine failed its grading, so a resume runs it again.
    assert (r.status, r.reward, flaky.attempts, flaky.graders) == (
        RolloutStatus.FAILED,
        None,
        1,
        1,
    )
    assert r.error == ("verifier could not run: the verifier's sandbox did not come up"), r.error
    assert not kept(await store.rollout(r.rollout_id))


async def test_infrastructure_retries_are_bounded(
    tasks: list[Any], engine_url: str, store: Store, installed: Any, tmp_path: Path
) -> None:
    async with provider_of("local", tmp_path / "boxes") as real:
        flaky = FlakyProvider(real, failures=10)
        result = await run_batch(
            tasks[:1],
            harness=ShellHarness(SOLVES_HELLO),
            installed=installed,
            sandbox=flaky,
            backends=[engine_url],
            store=store,
            retries=1,
            logs_root=tmp_path / "logs",
        )

    (r,) = result.results
    assert r.status is RolloutStatus.FAILED
    assert (r.error or "").startswith("infrastructure:")
    assert flaky.attempts == 2


def test_killed_run_resumes_without_duplicates(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'store.sqlite'}"
    marker = tmp_path / "started"
    args = [sys.executable, "-m", "tests.support.resumable_batch", db, str(tmp_path), str(marker)]

    first = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Kill the runner while some rollouts are done and others are mid-harness.
    for _ in range(600):
        if marker.exists() and len(marker.read_text().split()) >= 2:
            break
        if first.poll() is not None:
            raise AssertionError(first.stderr.read().decode())  # type: ignore[union-attr]
        subprocess.run(["sleep", "0.1"], check=True)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    # The killed run left its sandboxes (keyed by its lease's token) and its lease.
    boxes = tmp_path / "boxes"
    (left,) = [p.name for p in boxes.iterdir()]
    assert left.startswith("resumable.")
    with sqlite3.connect(tmp_path / "store.sqlite") as conn:
        ((token, pid),) = conn.execute("SELECT token, pid FROM batch_lease").fetchall()
    assert pid == first.pid
    assert left == f"resumable.{token}"

    second = subprocess.run([*args, "--fast"], cwd=ROOT, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    # Its holder is gone (the pid is dead): the resume took the lease over, swept what the
    # killed run left, and released the lease at its end.
    assert list(boxes.iterdir()) == []
    with sqlite3.connect(tmp_path / "store.sqlite") as conn:
        assert conn.execute("SELECT count(*) FROM batch_lease").fetchone() == (0,)

    async def check() -> None:
        async with opened_store(db) as store:
            views = await store.rollouts()
        current: dict[tuple[str | None, int | None], list[Any]] = {}
        for v in views:
            if v.status is not RolloutStatus.CANCELLED:
                current.setdefault((v.task_id, v.sample_index), []).append(v)
        # Every sample has exactly one live rollout, and it finished with a reward.
        assert len(current) == 6
        assert all(len(vs) == 1 for vs in current.values())
        assert all(vs[0].status is RolloutStatus.SUCCEEDED for vs in current.values())
        assert all(vs[0].reward == 1.0 for vs in current.values())
        # The kill interrupted work: those attempts were cancelled, pointing at their successor.
        cancelled = [v for v in views if v.status is RolloutStatus.CANCELLED]
        assert cancelled
        for v in cancelled:
            assert v.meta["superseded_by"] in {x.id for x in views}
        # What finished before the kill was kept, not run again.
        kept = [vs[0] for vs in current.values() if vs[0].attempt == 0]
        assert len(kept) >= 2
        assert all(v.finished_at < cancelled[0].finished_at for v in kept[:2])  # type: ignore[operator]

    asyncio.run(check())


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [(4, 0, 1, 0.0), (4, 4, 1, 1.0), (4, 1, 1, 0.25), (4, 1, 4, 1.0), (5, 2, 2, 0.7)],
)
def test_pass_at_k(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


async def test_a_sampling_option_the_proxy_cannot_impose_is_refused_before_anything_runs(
    tasks: list[Any], store: Store
) -> None:
    with pytest.raises(ValueError, match="sampling option 'temprature' is not supported"):
        await run_batch(tasks, sampling={"temprature": 0}, store=store)
    assert await store.rollouts() == []
