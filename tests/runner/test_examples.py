"""The shipped example tasks, through the real sandboxes: every reference solution scores 1 and
doing nothing scores 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from rolltap.runner.sandboxes.provision import provision, solve
from rolltap.runner.tasks import Task, load_tasks
from rolltap.runner.verify import verify
from tests.support.sandboxes import KINDS, provider_of, spec_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
TASKS = {t.id: t for t in load_tasks(EXAMPLES)}


def test_the_example_set_loads_whole() -> None:
    dirs = sorted(d.name for d in EXAMPLES.iterdir() if (d / "task.toml").is_file())

    assert len(dirs) == 13
    assert set(dirs) < set(TASKS)
    assert all(TASKS[d].solution_dir is not None for d in dirs)
    assert sum(t.reward_from_exit_code for t in TASKS.values()) == 3


@pytest.mark.parametrize("task_dir", sorted(d for d in EXAMPLES.iterdir() if d.is_dir()))
def test_each_dockerfile_follows_the_portable_rule(task_dir: Path) -> None:
    env = task_dir / "environment"
    expected = ["FROM rolltap/base:bookworm", "WORKDIR /app"]
    if (env / "files").is_dir():
        expected.append("COPY files/ /app/")
    if (env / "setup.sh").is_file():
        expected.append("COPY setup.sh /tmp/rolltap-setup.sh")
        expected.append("RUN cd /app && bash /tmp/rolltap-setup.sh && rm /tmp/rolltap-setup.sh")

    assert (env / "Dockerfile").read_text().splitlines() == expected


@pytest.mark.parametrize("task_id", sorted(TASKS))
@pytest.mark.parametrize("kind", KINDS)
async def test_the_solution_scores_1_and_an_empty_attempt_0(
    kind: str, task_id: str, tmp_path: Path
) -> None:
    task = TASKS[task_id]
    async with provider_of(kind, tmp_path / "ws") as provider:
        empty = await _attempt(provider, task, solved=False, out=tmp_path / "empty")
        solved = await _attempt(provider, task, solved=True, out=tmp_path / "solved")

    assert (empty, solved) == (0.0, 1.0)


async def _attempt(provider, task: Task, *, solved: bool, out: Path) -> float:
    box = await provider.create(spec_for(task, run_id="examples"))
    try:
        await provision(box, task)
        if solved:
            result = await solve(box, task)
            assert result.ok, result.stderr
        verdict = await verify(box, task, out)
    finally:
        await box.close()
    return verdict.reward.value
