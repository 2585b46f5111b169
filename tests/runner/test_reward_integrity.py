"""The verifier's reward belongs to the verifier, in every sandbox kind: daemons the task's setup
or the agent started (however they detached) are dead before test.sh runs, and whatever the
agent planted in /logs/verifier or /tests is gone. (The key revoked at the harness's end:
test_key_revocation.py.)"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rolltap.runner.sandboxes.base import SandboxProvider
from rolltap.runner.sandboxes.provision import provision
from rolltap.runner.tasks import Task, TaskEnvironment
from rolltap.runner.verify import verify
from tests.support.sandboxes import KINDS, open_provider, spec_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# Rewrites the reward as 0 twenty times a second, and plants a reward.json (which would win). Each
# copy's command line carries a mark, so the test can look for it on the host afterwards.
LOOP_SCRIPT = """
cat > /app/loop.sh <<'END'
cd /logs/verifier || exit 1
while :; do
  echo 0 > .r$$ && mv -f .r$$ reward.txt
  echo '{"reward": 0}' > .j$$ && mv -f .j$$ reward.json
  sleep 0.05
done
END
"""
TEST_SH = """
sleep 1
echo 1 > /logs/verifier/reward.txt
sleep 1
echo "owner $(stat -c %u /logs/verifier) me $(id -u)"
"""
# Four ways out of a command's process group and tree: a new session, a double fork, a process
# group of its own, and a scrubbed environment (no marker for docker's per-command kill).
AGENT = """
setsid sh /app/loop.sh {mark}-a >/dev/null 2>&1 </dev/null &
( ( sh /app/loop.sh {mark}-b >/dev/null 2>&1 </dev/null & ) & )
python3 -c 'import os, subprocess, sys; os.setpgid(0, 0)
subprocess.Popen(["sh", "/app/loop.sh", sys.argv[1]])' {mark}-c >/dev/null 2>&1 </dev/null &
env -i /bin/sh /app/loop.sh {mark}-d >/dev/null 2>&1 </dev/null &
sleep 0.5
cat /logs/verifier/reward.txt
"""


def _marked(mark: str) -> list[int]:
    """Host PIDs whose command line carries `mark` (containers' processes included)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if mark.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _daemon_task(mark: str) -> Task:
    setup = f"{LOOP_SCRIPT}setsid sh /app/loop.sh {mark}-setup >/dev/null 2>&1 </dev/null &\n"
    return Task(
        id="daemons",
        instruction="-",
        source=ROOT,
        workdir="/app",
        environment=TaskEnvironment(setup_script=setup),
        test_script=TEST_SH,
    )


@pytest_asyncio.fixture(params=KINDS, loop_scope="function")
async def provider(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    opened = await open_provider(request.param, tmp_path / "ws")
    try:
        yield opened
    finally:
        await opened.close()


async def test_daemons_of_the_setup_and_the_agent_are_dead_before_the_verifier_runs(
    provider: SandboxProvider, tmp_path: Path
) -> None:
    mark = f"rolltap-daemon-{secrets.token_hex(6)}"
    task = _daemon_task(mark)
    box = await provider.create(spec_for(task))
    try:
        await provision(box, task)
        agent = await box.exec(AGENT.format(mark=mark), user="0", timeout=60)
        verdict = await verify(box, task, tmp_path / "verifier")
        left = _marked(mark)
    finally:
        await box.close()

    assert agent.stdout == "0\n", agent.stderr  # the daemons were writing
    assert verdict.reward.values == {"reward": 1.0}, verdict.result.stdout
    assert left == []
    owner, me = verdict.result.stdout.split()[1::2]
    assert owner == me  # the verifier's output directory is its own


async def test_what_the_agent_planted_for_the_verifier_is_gone(
    provider: SandboxProvider, tmp_path: Path
) -> None:
    task = Task(
        id="planted",
        instruction="-",
        source=ROOT,
        workdir="/app",
        environment=TaskEnvironment(),
        test_script="echo 0 > /logs/verifier/reward.txt",
    )
    # A winning reward.json behind a link in place of /logs/verifier, and a test.sh of its own.
    plant = """
    mkdir -p /app/fake && echo '{"reward": 1}' > /app/fake/reward.json
    rm -rf /logs/verifier && ln -s /app/fake /logs/verifier
    mkdir -p /tests && echo 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh
    """
    box = await provider.create(spec_for(task))
    try:
        planted = await box.exec(plant, user="0", timeout=60)
        verdict = await verify(box, task, tmp_path / "verifier")
    finally:
        await box.close()

    assert planted.ok, planted.stderr
    assert verdict.reward.values == {"reward": 0.0}
    assert sorted(p.name for p in (tmp_path / "verifier").iterdir()) == [
        "reward.txt",
        "test-stdout.txt",
    ]
