"""One rollout: INIT (sandbox + task setup), RUN (the harness), EVAL (the task's tests).

Each stage waits for a slot in its own pool, so a slow verifier never holds up harnesses. The
harness runs under a wall-clock timeout the sandbox enforces by killing its process tree. When
it ends, however it ends, its rollout key is revoked (the proxy refuses, and records, any later
call) and whatever it left running is killed, before the verifier's turn. The verifier grades in
a fresh sandbox holding a copy of the agent's workdir, or in the agent's own where the task says
so (runner/grading.py). The workdir's test files are kept (on the host) once the task's setup is
done and put back before the tests run (runner/verify.py).
Failures of the machine (a sandbox that did not start, a copy that failed) are retried as a new
attempt; timeouts and wrong answers are results, never retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, runtime_checkable

from rolltap import telemetry

from ..analysis.choice import load_detectors
from ..analysis.hacks import AUDIT_META, Detector, HackFlag, detect, hack_record
from ..analysis.reading import analyze_rollout
from ..store import RolloutStatus, Store
from ..store.events import HarnessEnded, Started
from ..store.lifecycle import status_of
from . import provenance
from .egress import EgressGate, EgressMode, sandbox_env
from .egress.settings import BUNDLE_NAME
from .grading import grading_sandbox
from .guard import HistoryNotPruned, describe, guard_workspace
from .harnesses import Ending, Harness, HarnessExit, Installation, Outcome, RunContext
from .harnesses.base import BuiltIn
from .plan import INFRA, Planned, next_attempt
from .sandboxes.base import (
    INSIDE_PROXY_DIR,
    EgressRoute,
    Limits,
    Mount,
    Sandbox,
    SandboxProvider,
    SandboxSpec,
)
from .sandboxes.errors import ImageBuildError, SandboxError
from .sandboxes.provision import provision
from .tasks import Task
from .verify import TEST_OUTPUT, KeptTests, Verification, VerifyError, keep_tests, verify

log = logging.getLogger("rolltap.runner")

AGENT_LOGS = PurePosixPath("/logs/agent")


@dataclass
class Pools:
    init: asyncio.Semaphore
    run: asyncio.Semaphore
    eval: asyncio.Semaphore

    @classmethod
    def sized(cls, init: int, run: int, eval_: int) -> Pools:
        return cls(asyncio.Semaphore(init), asyncio.Semaphore(run), asyncio.Semaphore(eval_))


@dataclass
class BatchProgress:
    """Counters the pipeline keeps and a progress display reads."""

    total: int = 0
    done: int = 0
    running: int = 0
    failed: int = 0
    rewards: list[float] = field(default_factory=list)
    finished: list[RolloutResult] = field(default_factory=list)
    """Every rollout as it finished, in that order (a display prints the ones it has not)."""
    started_at: float = field(default_factory=time.monotonic)
    token_count: Callable[[], float] = lambda: 0.0
    """Tokens the proxy recorded so far (set by the batch once its proxy runs)."""

    call_count: Callable[[], float] = lambda: 0.0
    """Calls the proxy recorded so far (likewise)."""

    @property
    def tokens(self) -> float:
        return self.token_count()

    @property
    def calls(self) -> float:
        return self.call_count()


@dataclass(frozen=True)
class RolloutResult:
    rollout_id: str
    task_id: str
    sample_index: int
    attempt: int
    status: RolloutStatus
    reward: float | None
    ending: Ending | None
    error: str | None
    logs_dir: Path
    seconds: dict[str, float]
    verifier_tail: str | None = None
    """The last lines of the verifier's output (also meta["verifier_tail"])."""
    harness_tail: str | None = None
    """The last lines of the harness's log (also meta["harness_tail"])."""
    harness_detail: str | None = None
    """How the harness said it ended, in its own words (e.g. mini-swe-agent's exit status)."""


@dataclass
class Shared:
    """What every rollout of a batch shares."""

    store: Store
    provider: SandboxProvider
    harness: Harness
    installation: Installation
    pools: Pools
    run_id: str
    proxy_socket: Path
    model: str
    logs_root: Path
    timeout: float | None
    max_steps: int | None
    retries: int
    progress: BatchProgress
    sandbox_kind: str
    image: str | None = None
    image_context: Path | None = None
    """harness_images/<name>/ ready to build: set when the harness comes from an image."""
    run_meta: dict[str, Any] = field(default_factory=dict)
    """The batch-wide part of each rollout's meta["run"] (runner/provenance.py)."""
    task_hashes: dict[str, str] = field(default_factory=dict)
    """Content hash of each task, by id."""
    revoke_key: Callable[[str], None] | None = None
    """Refuses a key at once in the batch's own proxy (ProxyHost.revoke). The revocation in the
    store reaches any other proxy on its next re-read of the rollout, within seconds."""
    egress: EgressGate | None = None
    """The run's egress gate (`--egress allowlist|intercept`); None: no way out but the proxy."""
    prune_git: bool = True
    """Prune git history beyond the base commit where the task allows it (runner/guard.py);
    False: `rolltap run --keep-git-history`."""
    detectors: Sequence[Detector] | None = None
    """The reward-hack detectors every finished rollout is checked with (analysis/hacks.py);
    None: `load_detectors()`."""


@runtime_checkable
class BuildsHarnessImages(Protocol):
    """A provider that runs a harness from an image built on the task's image (docker)."""

    async def harness_image(self, task: Task, name: str, context: Path) -> str: ...


@runtime_checkable
class KnowsTaskImages(Protocol):
    """A provider that starts a task from an image of its own (docker): the task's image."""

    async def task_image(self, task: Task) -> str: ...


class InfraFailure(Exception):
    """The machine failed the rollout; `calls_made` tells whether the harness reached the LLM."""

    def __init__(self, message: str, *, calls_made: bool) -> None:
        super().__init__(message)
        self.calls_made = calls_made


async def run_rollout(shared: Shared, planned: Planned) -> RolloutResult:
    """Runs a planned rollout, retrying infrastructure failures up to `shared.retries` times."""
    current = planned
    for tries in range(shared.retries + 1):
        try:
            return await _attempt(shared, current)
        except InfraFailure as failure:
            log.warning("rollout %s: infrastructure failure: %s", current.rollout_id, failure)
            if tries == shared.retries:
                return await _give_up(shared, current, str(failure))
            if failure.calls_made:
                # Its calls are recorded: a fresh attempt keeps them apart from the retry's.
                current = await next_attempt(shared.store, current, str(failure))
    raise AssertionError("unreachable")


async def _attempt(shared: Shared, planned: Planned) -> RolloutResult:
    trace = telemetry.begin_rollout(planned.rollout_id)
    try:
        # The workdir's test files as the setup left them, kept where no agent reaches.
        with tempfile.TemporaryDirectory(prefix="rolltap-kept-") as kept_root:
            return await _attempt_in(shared, planned, Path(kept_root) / "kept")
    finally:
        # Whatever happened, this attempt's sandbox has no more way out (idempotent).
        await _close_egress(shared, planned)
        await telemetry.end_rollout(trace, shared.store)


async def _attempt_in(shared: Shared, planned: Planned, kept_dir: Path) -> RolloutResult:
    task = planned.task
    logs = shared.logs_root / planned.rollout_id
    logs.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {"started": time.monotonic()}
    async with shared.pools.init:
        started = time.monotonic()
        try:
            spec = await _spec(shared, planned)
            await _record_run(shared, planned, spec)
            box = await shared.provider.create(spec)
        except ImageBuildError as e:
            return await _finish(shared, planned, logs, HarnessEnded(failure=str(e)), None, seconds)
        except SandboxError as e:
            raise InfraFailure(f"sandbox did not start: {e}", calls_made=False) from e
        try:
            await provision(box, task, log=logs / "setup.log")
            facts = await guard_workspace(box, task, prune=shared.prune_git, log=logs / "setup.log")
            kept = await keep_tests(box, task, kept_dir)
        except SandboxError as e:
            await box.close()
            raise InfraFailure(f"task setup failed: {e}", calls_made=False) from e
        except HistoryNotPruned as e:
            await box.close()
            return await _finish(shared, planned, logs, HarnessEnded(failure=str(e)), None, seconds)
        await _record_audit(shared, planned, facts, logs)
        seconds["init"] = time.monotonic() - started
        telemetry.phase_ended(telemetry.PROVISION, seconds["init"])
    try:
        async with shared.pools.run:
            started = time.monotonic()
            shared.progress.running += 1
            try:
                await shared.store.report(planned.rollout_id, Started())
                exit_, outcome, timed_out = await _run_harness(shared, planned, box, logs)
            except SandboxError as e:
                raise InfraFailure(f"harness could not run: {e}", calls_made=True) from e
            finally:
                shared.progress.running -= 1
                await _end_run(shared, planned, box)
            seconds["run"] = time.monotonic() - started
            telemetry.phase_ended(telemetry.HARNESS, seconds["run"])
        async with shared.pools.eval:
            started = time.monotonic()
            verdict, verify_error = await _evaluate(shared, planned, spec, box, logs, kept)
            seconds["eval"] = time.monotonic() - started
            telemetry.phase_ended(telemetry.VERIFY, seconds["eval"])
    finally:
        await box.close()
    reward = None if verdict is None else verdict.reward.value
    details: dict[str, Any] = {"ending": outcome.ending.value, "harness_detail": outcome.detail}
    if exit_.returncode is not None:
        details["harness_exit_code"] = exit_.returncode
    if verdict is not None:
        details |= {
            "values": dict(verdict.reward.values),
            "test_exit_code": verdict.result.exit_code,
            # Where test.sh ran (runner/grading.py): a fresh sandbox, or the agent's own.
            "verifier_sandbox": task.verifier_sandbox.value,
        }
        if verdict.restored:
            # What the agent changed of the task's tests (or planted to run first): put back.
            details["restored"] = list(verdict.restored)
    ended = HarnessEnded(
        reward,
        details,
        timed_out=timed_out,
        failure=_failure(outcome),
        verifier_failure=verify_error,
    )
    return await _finish(shared, planned, logs, ended, outcome.ending, seconds)


async def _run_harness(
    shared: Shared, planned: Planned, box: Sandbox, logs: Path
) -> tuple[HarnessExit, Outcome, bool]:
    proxy_url = box.proxy_url
    assert proxy_url is not None, "sandboxes of a batch always get the proxy socket"
    ctx = RunContext(
        instruction=planned.task.instruction,
        rollout_url=f"{proxy_url}/r/{planned.key}",
        key=planned.key,
        model=shared.model,
        workdir=PurePosixPath(box.workdir),
        home=PurePosixPath(box.home),
        logs_dir=AGENT_LOGS,
        max_steps=shared.max_steps,
        task=planned.task,
    )
    launch = shared.harness.launch(ctx, shared.installation)
    for inside_path, host_path in launch.copies.items():
        await box.put(host_path, str(inside_path))
    with tempfile.TemporaryDirectory() as tmp:
        for i, (inside, content) in enumerate(launch.files.items()):
            staged = Path(tmp) / str(i)
            staged.write_text(content)
            await box.put(staged, str(inside))
    timeout = shared.timeout or planned.task.agent_timeout_sec
    # Unprivileged where the kind would run it as root (docker): its paths become its own.
    await box.hand_over(box.agent_user)
    result = await box.exec(
        list(launch.argv),
        env=dict(launch.env),
        cwd=str(launch.cwd),
        timeout=timeout,
        log=logs / "harness.log",
        user=box.agent_user,
    )
    if launch.stdout_path is not None:
        (logs / "harness-stdout.txt").write_text(result.stdout)
    files: dict[PurePosixPath, bytes] = {}
    agent_logs = logs / "agent"
    with contextlib.suppress(SandboxError):
        await box.get(str(AGENT_LOGS), agent_logs)
    for path in launch.logs:
        local = (
            agent_logs / path.relative_to(AGENT_LOGS) if path.is_relative_to(AGENT_LOGS) else None
        )
        if local is None:
            local = logs / "harness-files" / path.name
            with contextlib.suppress(SandboxError):
                await box.get(str(path), local)
        if local.is_file():
            files[path] = local.read_bytes()
    exit_ = HarnessExit(
        None if result.timed_out else result.exit_code, result.stdout, result.stderr, files
    )
    return exit_, shared.harness.classify(ctx, exit_), result.timed_out


async def _end_run(shared: Shared, planned: Planned, box: Sandbox) -> None:
    """The harness has ended: its key opens nothing any more, and nothing it left runs on (so
    no daemon of the agent's works past its time while the rollout waits for a verifier)."""
    if shared.revoke_key is not None:
        shared.revoke_key(planned.key)
    await _close_egress(shared, planned)
    await shared.store.update_rollout(planned.rollout_id, key_revoked_at=datetime.now(UTC))
    try:
        await box.reap()
    except SandboxError as e:
        raise InfraFailure(f"cannot stop what the harness left: {e}", calls_made=True) from e


async def _evaluate(
    shared: Shared, planned: Planned, spec: SandboxSpec, box: Sandbox, logs: Path, kept: KeptTests
) -> tuple[Verification | None, str | None]:
    try:
        async with grading_sandbox(
            shared.provider, spec, box, image=shared.image, log=logs / "setup.log"
        ) as grader:
            return await verify(grader, planned.task, logs / "verifier", kept=kept), None
    except VerifyError as e:
        return None, f"verifier: {e}"
    except SandboxError as e:
        return None, f"verifier could not run: {e}"


def _failure(outcome: Outcome) -> str | None:
    """Why the harness ended otherwise than on its own (its step limit is its own), or None."""
    if outcome.ending in (Ending.FINISHED, Ending.LIMIT):
        return None
    return f"harness {outcome.ending.value}: {outcome.detail}"[:2000]


async def _finish(
    shared: Shared,
    planned: Planned,
    logs: Path,
    ended: HarnessEnded,
    ending: Ending | None,
    seconds: dict[str, float],
) -> RolloutResult:
    store = shared.store
    started = seconds.pop("started", None)
    # Why a rollout got the reward it got, without opening its logs: their last lines.
    tails = {
        "verifier_tail": _tail(logs / "verifier" / TEST_OUTPUT),
        "harness_tail": _tail(logs / "harness.log"),
    }
    ended = replace(ended, meta={"logs_dir": str(logs), "seconds": seconds, **tails})
    flags = await _hack_flags(shared, planned, status_of(ended))
    # An ending the proxy wrote first (its budget, its batch's bound on staleness) stays: the
    # lifecycle keeps it, records the reward and the rest beside it, and says which ending the
    # rollout has (store/lifecycle.py).
    view = await store.report(planned.rollout_id, ended, hack_flags=flags)
    status, error, reward, details = view.status, view.error, ended.reward, ended.details
    if view.n_calls:
        # The finished rollout's segments, drift breaks and faithfulness go into the store too.
        await analyze_rollout(store, planned.rollout_id)
    store.forget(planned.rollout_id)
    if started is not None:
        seconds["total"] = time.monotonic() - started
    progress = shared.progress
    progress.done += 1
    if status is not RolloutStatus.SUCCEEDED:
        progress.failed += 1
    if reward is not None:
        progress.rewards.append(reward)
    result = RolloutResult(
        planned.rollout_id,
        planned.task.id,
        planned.sample_index,
        planned.attempt,
        status,
        reward,
        ending,
        error,
        logs,
        seconds,
        **tails,
        harness_detail=(details or {}).get("harness_detail"),
    )
    progress.finished.append(result)
    return result


async def _hack_flags(shared: Shared, planned: Planned, status: RolloutStatus) -> list[HackFlag]:
    """What the reward-hack detectors flag in the rollout's record (analysis/hacks.py), read once
    all of it is stored: its calls, and its egress requests flushed."""
    if shared.egress is not None:
        await shared.egress.flush(shared.store)
    record = await hack_record(shared.store, planned.rollout_id)
    record = replace(record, rollout=replace(record.rollout, status=status))
    detectors = load_detectors() if shared.detectors is None else shared.detectors
    # Off the event loop: the proxy of `rolltap run` serves other rollouts' calls on it.
    return await asyncio.to_thread(detect, record, detectors)


async def _record_audit(
    shared: Shared, planned: Planned, facts: dict[str, Any], logs: Path
) -> None:
    """What the detectors will need of the task (runner/guard.py), kept with the rollout."""
    line = describe(facts)
    if line is not None:
        with (logs / "setup.log").open("a") as f:
            f.write(f"rolltap: {line}\n")
    await shared.store.update_rollout(planned.rollout_id, merge_meta={AUDIT_META: facts})


def _tail(path: Path, lines: int = 8, chars: int = 2000) -> str | None:
    """The last non-blank lines of a log, or None when there is none."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    kept = [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(kept)[-chars:] or None


async def _give_up(shared: Shared, planned: Planned, why: str) -> RolloutResult:
    await shared.store.update_rollout(planned.rollout_id, merge_meta={INFRA: True})
    logs = shared.logs_root / planned.rollout_id
    lost = HarnessEnded(failure=f"infrastructure: {why}")
    return await _finish(shared, planned, logs, lost, None, {})


async def _spec(shared: Shared, planned: Planned) -> SandboxSpec:
    task = planned.task
    image, mounts = shared.image, _mounts(shared.harness, shared.installation)
    if shared.image_context is not None:
        assert isinstance(shared.provider, BuildsHarnessImages)
        image = await shared.provider.harness_image(task, shared.harness.name, shared.image_context)
        mounts = ()
    route, env = await _open_egress(shared, planned)
    return SandboxSpec(
        task=task,
        run_id=shared.run_id,
        rollout_id=planned.rollout_id,
        proxy_socket=shared.proxy_socket,
        mounts=mounts,
        image=image,
        env=env,
        limits=Limits(memory_mb=task.environment.memory_mb, cpus=task.environment.cpus),
        egress=route,
    )


async def _open_egress(
    shared: Shared, planned: Planned
) -> tuple[EgressRoute | None, dict[str, str]]:
    gate = shared.egress
    if gate is None:
        return None, {}
    settings = gate.settings
    route = await gate.admit(
        planned.rollout_id,
        planned.key,
        settings.allow_for(planned.task),
        intercept=settings.mode is EgressMode.INTERCEPT,
    )
    return route, sandbox_env(f"{INSIDE_PROXY_DIR}/{BUNDLE_NAME}", route.port)


async def _close_egress(shared: Shared, planned: Planned) -> None:
    if shared.egress is not None:
        await shared.egress.revoke(planned.rollout_id)


async def _record_run(shared: Shared, planned: Planned, spec: SandboxSpec) -> None:
    """What this rollout runs with, for whoever runs it again (runner/provenance.py)."""
    task = planned.task
    task_hash = shared.task_hashes.get(task.id)
    if task_hash is None:
        task_hash = await asyncio.to_thread(provenance.task_hash, task)
    image = spec.image
    if image is None and isinstance(shared.provider, KnowsTaskImages):
        image = await shared.provider.task_image(task)  # built once; create() finds it
    run = provenance.run_metadata(shared.run_meta, task, task_hash, shared.sandbox_kind, image)
    await shared.store.update_rollout(planned.rollout_id, merge_meta={"run": run})


def _mounts(harness: Harness, installation: Installation) -> tuple[Mount, ...]:
    if isinstance(harness.packages, BuiltIn):
        return ()  # part of rolltap: nothing to show the sandbox
    paths = [installation.prefix, *installation.mounts]
    return tuple(Mount(Path(str(p)), str(p), read_only=True) for p in paths)
