"""What only the docker kind does: task images, labels, limits, users."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import pytest_asyncio

from rolltap.runner.sandboxes.base import Limits
from rolltap.runner.sandboxes.docker import (
    BASE_IMAGE,
    DEFAULT_PIDS_LIMIT,
    LABEL_ROLLOUT,
    LABEL_RUN,
    LABEL_TASK,
    DockerProvider,
)
from rolltap.runner.sandboxes.errors import ImageBuildError
from rolltap.runner.sandboxes.provision import provision
from rolltap.runner.tasks import TaskEnvironment
from tests.support.sandboxes import open_provider, plain_task, spec_for


@pytest_asyncio.fixture(loop_scope="function")
async def provider(tmp_path: Path) -> AsyncIterator[DockerProvider]:
    opened = await open_provider("docker", tmp_path)
    assert isinstance(opened, DockerProvider)
    yield opened
    await opened.close()


async def test_containers_carry_labels_limits_and_no_network(provider: DockerProvider) -> None:
    spec = spec_for(plain_task(), limits=Limits(memory_mb=256, pids=64, cpus=0.5))
    box = await provider.create(spec)
    try:
        attrs = await provider.run(provider.raw.inspect_container, box.container_id)
        fork_bomb = await box.exec("for i in $(seq 100); do sleep 5 & done; wait", timeout=30)
    finally:
        await box.close()

    assert attrs["Config"]["Labels"] == {
        LABEL_RUN: spec.run_id,
        LABEL_ROLLOUT: spec.rollout_id,
        LABEL_TASK: "plain",
    }
    host = attrs["HostConfig"]
    assert (host["Memory"], host["PidsLimit"], host["NanoCpus"]) == (256 << 20, 64, 500_000_000)
    assert (host["NetworkMode"], host["AutoRemove"], host["Init"]) == ("none", False, True)
    assert "Resource temporarily unavailable" in fork_bomb.stderr


async def test_containers_hold_no_privilege_and_a_default_pid_cap(
    provider: DockerProvider,
) -> None:
    box = await provider.create(spec_for(plain_task()))
    try:
        attrs = await provider.run(provider.raw.inspect_container, box.container_id)
        # A setuid-root copy of `id`, run by nobody: no-new-privileges keeps it nobody.
        made = await box.exec("cp /usr/bin/id /tmp/id && chmod 4755 /tmp/id", user="0")
        setuid = await box.exec("/tmp/id; grep NoNewPrivs /proc/self/status", user="nobody")
    finally:
        await box.close()

    host = attrs["HostConfig"]
    assert host["CapDrop"] == ["ALL"]
    assert not host["CapAdd"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["PidsLimit"] == DEFAULT_PIDS_LIMIT
    assert made.ok, made.stderr
    assert setuid.stdout.startswith("uid=65534(nobody)"), setuid.stderr
    assert "euid=0" not in setuid.stdout
    assert "NoNewPrivs:\t1" in setuid.stdout


async def test_commands_run_as_the_images_user_unless_told(
    provider: DockerProvider, tmp_path: Path
) -> None:
    context = tmp_path / "env"
    context.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nRUN useradd -m worker\nUSER worker\nWORKDIR /home/worker\n"
    )
    task = replace(
        plain_task(f"user-{secrets.token_hex(3)}", workdir="/home/worker"),
        environment=TaskEnvironment(dockerfile_dir=context),
    )
    box = await provider.create(spec_for(task))
    try:
        default = await box.exec("id -un")
        root = await box.exec("id -un", user="0")
        logs = await box.exec("touch /logs/agent/x", user="0")
    finally:
        await box.close()

    assert box.environment_built
    assert (default.stdout, root.stdout) == ("worker\n", "root\n")
    assert logs.ok


async def test_task_images_are_built_once_per_content(
    provider: DockerProvider, tmp_path: Path
) -> None:
    context = tmp_path / "env"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN echo {secrets.token_hex(4)}\n")
    task = replace(plain_task("cached"), environment=TaskEnvironment(dockerfile_dir=context))

    first = await provider.task_image(task)
    again = await provider.task_image(task)
    (context / "extra.txt").write_text("changed")
    changed = await provider.task_image(task)

    assert first == again
    assert first.startswith("rolltap-task/cached:")
    assert changed != first
    assert await provider.task_image(plain_task()) == BASE_IMAGE


async def test_a_broken_dockerfile_is_an_image_build_error(
    provider: DockerProvider, tmp_path: Path
) -> None:
    context = tmp_path / "env"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN exit 3\n")
    task = replace(plain_task("broken"), environment=TaskEnvironment(dockerfile_dir=context))

    with pytest.raises(ImageBuildError, match="broken"):
        await provider.create(spec_for(task))


async def test_compose_environments_are_refused(provider: DockerProvider, tmp_path: Path) -> None:
    compose = tmp_path / "docker-compose.yaml"
    compose.write_text("services: {}\n")
    task = replace(plain_task(), environment=TaskEnvironment(compose_file=compose))

    with pytest.raises(ImageBuildError, match="compose"):
        await provider.task_image(task)


async def test_the_agent_is_handed_its_paths_and_a_home_its_tasks_setup_removed(
    provider: DockerProvider,
) -> None:
    setup = "rm -rf /home/rolltap && echo given > /app/given.txt"
    task = replace(plain_task(), environment=TaskEnvironment(setup_script=setup))
    box = await provider.create(spec_for(task))
    try:
        await provision(box, task)
        await box.hand_over(box.agent_user)
        paths = f"{box.home} /app /app/given.txt /logs/agent /logs/artifacts"
        handed = await box.exec(f"stat -c %u {paths}", user=box.agent_user)
        await box.hand_over(None)
        back = await box.exec("stat -c %u /app /app/given.txt", user="0")
    finally:
        await box.close()

    assert handed.stdout.split() == ["61000"] * 5, handed.stderr
    assert back.stdout.split() == ["0", "0"]
