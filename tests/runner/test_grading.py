"""Where the verifier grades (runner/grading.py), end to end with the real oracle, sandboxes and
verifier: by default a fresh sandbox from the task's environment, set up again, that holds the
agent's workdir exactly (files, modes, links as links, what it deleted) and nothing else of its
run; with `verifier_sandbox: agent`, the agent's own sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rolltap.runner import run_batch
from rolltap.runner.tasks import TaskFormatError, VerifierSandbox, load_tasks
from rolltap.store import Store
from tests.support.sandboxes import provider_of

pytestmark = pytest.mark.slow

SETUP = "echo given > given.txt; echo gone > gone.txt; echo made > /tmp/setup-made"
SOLUTION = (
    "echo work > work.sh && chmod +x work.sh && rm gone.txt && echo more >> given.txt && "
    "ln -s /usr/bin/python3 py && ln -s work.sh rel && mkdir -p sub/deep && echo x > sub/deep/f && "
    'echo agent > /tmp/agent-made && echo home > "$HOME/agent-home" && echo "$HOME" > home'
)
# What test.sh sees, one fact a line, into the verifier's folder (the reward: its exit code).
# The agent's HOME is not the verifier's in docker: the agent says where it was.
FACTS = (
    "{ ls -A | sort | tr '\\n' ' '; echo; cat given.txt | tr '\\n' ' '; echo; "
    "test -x work.sh && echo executable; readlink py; readlink rel; cat sub/deep/f; "
    "test -e /tmp/setup-made && echo setup-ran; "
    "test -e /tmp/agent-made && echo agent-tmp || echo no-agent-tmp; "
    'test -e "$(cat home)/agent-home" && echo agent-home || echo no-agent-home; '
    "} > /logs/verifier/facts.txt"
)


def _tasks(tmp_path: Path) -> Path:
    lines = [
        {"id": f"work.{where.value}", "instruction": "-", "setup": SETUP, "test": FACTS,
         "solution": SOLUTION, "verifier_sandbox": where.value}
        for where in VerifierSandbox
    ]  # fmt: skip
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("kind", ["bwrap", "docker"])
async def test_the_fresh_verifier_sees_the_agents_workdir_and_nothing_else(
    kind: str, store: Store, tmp_path: Path
) -> None:
    tasks = load_tasks(_tasks(tmp_path))
    async with provider_of(kind, tmp_path / "boxes") as provider:
        result = await run_batch(
            tasks, harness="oracle", sandbox=provider, store=store, logs_root=tmp_path / "logs"
        )

    facts = {}
    for r in result.results:
        assert r.reward == 1.0, r.verifier_tail
        facts[r.task_id] = (r.logs_dir / "verifier" / "facts.txt").read_text().splitlines()
        details = (await store.rollout(r.rollout_id)).reward_details or {}
        assert details["verifier_sandbox"] == r.task_id.removeprefix("work.")
    workdir = [
        "given.txt home py rel sub work.sh ",
        "given more ",
        "executable",
        "/usr/bin/python3",
        "work.sh",
        "x",
        "setup-ran",
    ]
    # In a fresh sandbox: the workdir as the agent left it (gone.txt stays gone, links stay
    # links), the setup's own file outside it made again, the agent's outside it absent.
    assert facts["work.fresh"] == [*workdir, "no-agent-tmp", "no-agent-home"]
    assert facts["work.agent"] == [*workdir, "agent-tmp", "agent-home"]


def test_a_task_names_where_its_verifier_runs(tmp_path: Path) -> None:
    d = tmp_path / "t"
    (d / "tests").mkdir(parents=True)
    (d / "tests" / "test.sh").write_text("true\n")
    (d / "instruction.md").write_text("do it\n")
    (d / "task.toml").write_text('[verifier]\nsandbox = "agent"\n')
    (task,) = load_tasks(d)
    assert task.verifier_sandbox is VerifierSandbox.AGENT
    (d / "task.toml").write_text("[verifier]\ntimeout_sec = 5\n")
    assert load_tasks(d)[0].verifier_sandbox is VerifierSandbox.FRESH
    (d / "task.toml").write_text('[verifier]\nsandbox = "host"\n')
    with pytest.raises(TaskFormatError) as e:
        load_tasks(d)
    assert str(e.value) == (
        f'{d / "task.toml"} [verifier]: `sandbox` must be "fresh" or "agent", got \'host\''
    )
