"""Provisioning a task: environment files and setup script where no image did that already."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rolltap.runner.sandboxes.errors import SetupFailed
from rolltap.runner.sandboxes.provision import provision, solve
from rolltap.runner.tasks import TaskEnvironment
from tests.support.sandboxes import KINDS, plain_task, provider_of, spec_for


def portable_env(tmp_path: Path, setup: str) -> TaskEnvironment:
    env = tmp_path / "environment"
    (env / "files" / "sub").mkdir(parents=True)
    (env / "files" / "sub" / "data.txt").write_text("data\n")
    (env / "setup.sh").write_text(setup)
    (env / "Dockerfile").write_text(
        "FROM rolltap/base:bookworm\nWORKDIR /app\nCOPY files/ /app/\n"
        "COPY setup.sh /tmp/rolltap-setup.sh\n"
        "RUN cd /app && bash /tmp/rolltap-setup.sh && rm /tmp/rolltap-setup.sh\n"
    )
    return TaskEnvironment(dockerfile_dir=env, files_dir=env / "files", setup_script=setup)


@pytest.mark.parametrize("kind", KINDS)
async def test_files_and_setup_are_in_place_exactly_once(kind: str, tmp_path: Path) -> None:
    env = portable_env(tmp_path, "echo ran >> setup.log; cat sub/data.txt >> setup.log\n")
    task = replace(plain_task(f"portable-{kind}"), environment=env)
    async with provider_of(kind, tmp_path / "ws") as provider:
        box = await provider.create(spec_for(task))
        try:
            await provision(box, task)
            state = await box.exec("cat setup.log sub/data.txt")
        finally:
            await box.close()

    assert state.stdout == "ran\ndata\ndata\n"


@pytest.mark.parametrize("kind", ["local", "bwrap"])
async def test_a_failing_setup_is_setup_failed(kind: str, tmp_path: Path) -> None:
    task = replace(
        plain_task(), environment=TaskEnvironment(setup_script="echo broken >&2; exit 4")
    )
    async with provider_of(kind, tmp_path / "ws") as provider:
        box = await provider.create(spec_for(task))
        try:
            with pytest.raises(SetupFailed, match="exited with 4: broken"):
                await provision(box, task)
        finally:
            await box.close()


async def test_an_inline_solution_runs_in_the_workdir(tmp_path: Path) -> None:
    task = replace(plain_task(), solution_script="pwd > where.txt")
    async with provider_of("bwrap", tmp_path / "ws") as provider:
        box = await provider.create(spec_for(task))
        try:
            result = await solve(box, task)
            where = await box.exec("cat /app/where.txt")
        finally:
            await box.close()

    assert result.ok
    assert where.stdout == "/app\n"
