"""Runs a harness adapter's Launch as a plain subprocess against a ScriptedLLM, for harness tests.

The "sandbox" here is a temp directory: workdir, HOME and the logs dir are real absolute paths, so
the Launch's in-sandbox paths are host paths as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest

from rolltap.runner.harnesses import (
    Harness,
    HarnessExit,
    Installation,
    Launch,
    NotInstalled,
    Outcome,
    RunContext,
    installation,
)
from tests.support.scripted_llm import ScriptedLLM, serve

KEY = "rk_test_0123456789abcdef"
MODEL = "scripted-model"


@dataclass(frozen=True)
class Episode:
    ctx: RunContext
    launch: Launch
    exit: HarnessExit
    outcome: Outcome

    @property
    def workdir(self) -> Path:
        return Path(self.ctx.workdir)


def installed(harness: Harness) -> Installation:
    """The host installation, or skip the test with the command that installs it."""
    try:
        return installation(harness)
    except NotInstalled:
        pytest.skip(
            f"{harness.name} is not installed: run `rolltap harness install {harness.name}`"
        )


def context(tmp: Path, root_url: str, instruction: str, max_steps: int | None = None) -> RunContext:
    for sub in ("work", "home", "logs"):
        (tmp / sub).mkdir(exist_ok=True)
    return RunContext(
        instruction=instruction,
        rollout_url=f"{root_url}/r/{KEY}",
        key=KEY,
        model=MODEL,
        workdir=PurePosixPath(tmp / "work"),
        home=PurePosixPath(tmp / "home"),
        logs_dir=PurePosixPath(tmp / "logs"),
        max_steps=max_steps,
    )


async def run_launch(launch: Launch, timeout: float = 240) -> HarnessExit:
    """Write the Launch's files, run it with stdin from /dev/null, collect its log files."""
    for path, content in launch.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content)
    proc = await asyncio.create_subprocess_exec(
        *launch.argv,
        cwd=launch.cwd,
        env=dict(launch.env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    returncode: int | None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        returncode = proc.returncode
    except TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = await proc.communicate()
        returncode = None
    finally:
        # Whatever the harness left running in its session goes with it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    if launch.stdout_path is not None:
        Path(launch.stdout_path).parent.mkdir(parents=True, exist_ok=True)
        Path(launch.stdout_path).write_bytes(out)
    files = {p: Path(p).read_bytes() for p in launch.logs if Path(p).is_file()}
    return HarnessExit(
        returncode, out.decode(errors="replace"), err.decode(errors="replace"), files
    )


async def run_episode(
    harness: Harness,
    llm: ScriptedLLM,
    tmp: Path,
    instruction: str = "Create hello.txt containing hi.",
    max_steps: int | None = None,
) -> Episode:
    inst = installed(harness)
    async with serve(llm) as root_url:
        ctx = context(tmp, root_url, instruction, max_steps)
        launch = harness.launch(ctx, inst)
        exit = await run_launch(launch)
    return Episode(ctx, launch, exit, harness.classify(ctx, exit))


def assert_keyed(llm: ScriptedLLM, suffix: str) -> None:
    """Every model call went to the rollout-keyed path and carried the key as its credential."""
    calls = llm.posts(suffix)
    assert calls, f"no POST ...{suffix} reached the server: {[s.path for s in llm.seen]}"
    for seen in calls:
        assert seen.path.startswith(f"/r/{KEY}/"), seen.path
        credential = seen.headers.get("Authorization") or seen.headers.get("x-api-key") or ""
        assert credential in (f"Bearer {KEY}", KEY), credential
