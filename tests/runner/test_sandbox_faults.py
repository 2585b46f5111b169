"""Faults: hung commands die with their whole process tree, crashed runners leak nothing for
long, and sandboxes that cannot start say so with a typed error."""

from __future__ import annotations

import asyncio
import io
import secrets
import signal
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import docker
import pytest

from rolltap.runner.sandboxes.base import Mount
from rolltap.runner.sandboxes.bwrap import BwrapProvider
from rolltap.runner.sandboxes.docker import LABEL_RUN, DockerProvider
from rolltap.runner.sandboxes.errors import (
    ImageBuildError,
    SandboxStartError,
    SandboxUnavailable,
)
from tests.support.sandboxes import (
    ISOLATED_KINDS,
    KINDS,
    fake_proxy,
    host_processes_running,
    plain_task,
    provider_of,
    searchable,
    spec_for,
)
from tests.support.waiting import until


def _marker() -> str:
    """A sleep duration no other process on the machine is using."""
    return f"9{secrets.randbelow(10**6):06d}.{secrets.randbelow(10**6):06d}"


@pytest.mark.parametrize("kind", ISOLATED_KINDS)
async def test_a_hung_command_dies_at_its_timeout_with_every_descendant(
    kind: str, tmp_path: Path
) -> None:
    mark = _marker()
    # A session leader's child, an orphan double-forked away, and the foreground sleep.
    script = f"""
        setsid sh -c 'sleep {mark} & exec sleep {mark}' &
        ( sleep {mark} & ) &
        exec sleep {mark}
    """
    async with provider_of(kind, tmp_path) as provider:
        box = await provider.create(spec_for(plain_task()))
        try:
            running = asyncio.ensure_future(box.exec(script, timeout=4))
            await until(lambda: len(host_processes_running(f"sleep {mark}")) >= 4, "all started")
            result = await running
        finally:
            await box.close()

    assert result.timed_out
    assert result.exit_code == 124
    assert host_processes_running(f"sleep {mark}") == []


async def test_local_timeout_kills_the_group_and_its_descendants(tmp_path: Path) -> None:
    mark = _marker()
    script = f"sleep {mark} & setsid sleep {mark} & sleep {mark}"
    async with provider_of("local", tmp_path) as provider:
        box = await provider.create(spec_for(plain_task()))
        try:
            running = asyncio.ensure_future(box.exec(script, timeout=4))
            await until(lambda: len(host_processes_running(f"sleep {mark}")) >= 3, "all started")
            result = await running
        finally:
            await box.close()

    assert result.timed_out
    assert host_processes_running(f"sleep {mark}") == []


@pytest.mark.parametrize("kind", KINDS)
async def test_what_a_finished_command_left_holding_its_output_is_killed(
    kind: str, tmp_path: Path
) -> None:
    mark = _marker()
    async with provider_of(kind, tmp_path) as provider:
        box = await provider.create(spec_for(plain_task()))
        try:
            result = await box.exec(f"sleep {mark} & echo left; exit 3", timeout=60)
            after = host_processes_running(f"sleep {mark}")
        finally:
            await box.close()

    assert (result.exit_code, result.timed_out, result.stdout) == (3, False, "left\n")
    assert after == []


async def test_a_killed_runner_takes_its_bwrap_sandboxes_with_it(tmp_path: Path) -> None:
    async with provider_of("bwrap", tmp_path):
        pass  # skips here when bwrap is missing
    mark = _marker()
    runner = _runner_script(
        f"""
        from rolltap.runner.sandboxes.bwrap import BwrapProvider
        provider = BwrapProvider(Path({str(searchable(tmp_path))!r}))
        box = await provider.create(spec_for(plain_task()))
        print("created", flush=True)
        await box.exec("sleep {mark}")
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", runner], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "created\n"
        await until(lambda: host_processes_running(f"sleep {mark}") != [], "the sleep started")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        await until(lambda: host_processes_running(f"sleep {mark}") == [], "the sandbox died")
    finally:
        proc.kill()
        proc.wait()


async def test_a_killed_runner_leaves_containers_that_the_ttl_stops_and_sweep_removes(
    tmp_path: Path,
) -> None:
    async with provider_of("docker", tmp_path):
        pass  # skips here when no daemon answers
    run_id = f"crash-{secrets.token_hex(4)}"
    runner = _runner_script(
        f"""
        from rolltap.runner.sandboxes.docker import DockerProvider
        for ttl in (3600, 5):
            provider = await DockerProvider.connect(ttl_sec=ttl)
            await provider.create(spec_for(plain_task(), run_id={run_id!r} + str(ttl)))
        print("created", flush=True)
        await asyncio.sleep(3600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", runner], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "created\n"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    client = docker.DockerClient(base_url="unix:///var/run/docker.sock")
    try:

        def left(ttl: int, *, running: bool = False) -> list[object]:
            found = client.api.containers(
                all=not running, filters={"label": f"{LABEL_RUN}={run_id}{ttl}"}
            )
            return list(found)

        assert len(left(5, running=True)) == 1
        assert len(left(3600, running=True)) == 1
        # The TTL ends the short-lived one's processes; the stopped container waits for a sweep.
        await until(lambda: left(5, running=True) == [], "the short-lived one ended", timeout=20)
        assert len(left(3600, running=True)) == 1
        provider = await DockerProvider.connect()
        try:
            assert await provider.sweep(f"{run_id}3600") == 1
            assert await provider.sweep(f"{run_id}5") == 1
        finally:
            await provider.close()
        assert left(3600) == left(5) == []
    finally:
        client.close()


async def test_bwrap_missing_means_unavailable() -> None:
    with pytest.raises(SandboxUnavailable, match="not found"):
        BwrapProvider(bwrap="/nonexistent/bwrap")


async def test_bwrap_start_failures_are_typed(tmp_path: Path) -> None:
    async with provider_of("bwrap", tmp_path) as provider:
        with pytest.raises(ImageBuildError):
            await provider.create(spec_for(plain_task(), image="/nonexistent/rootfs"))
        mount = Mount(tmp_path / "missing", "/opt/harness")
        with pytest.raises(SandboxStartError, match="mount source"):
            await provider.create(spec_for(plain_task(), mounts=(mount,)))


async def test_no_docker_daemon_means_unavailable(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailable, match="no docker daemon"):
        await DockerProvider.connect(f"unix://{tmp_path}/no-daemon.sock")


async def test_docker_start_failures_are_typed_and_leave_nothing(tmp_path: Path) -> None:
    async with provider_of("docker", tmp_path) as any_provider:
        assert isinstance(any_provider, DockerProvider)
        raw = any_provider.raw
        empty = "rolltap-test/empty:latest"
        no_python = "rolltap-test/no-python:latest"
        await any_provider.run(_import_empty_image, raw, empty)
        (tmp_path / "ctx").mkdir()
        (tmp_path / "ctx" / "Dockerfile").write_text(
            "FROM rolltap/base:bookworm\nRUN rm -f /usr/bin/python3*\n"
        )
        context = str(tmp_path / "ctx")
        await any_provider.run(lambda: list(raw.build(path=context, tag=no_python, forcerm=True)))

    provider = await DockerProvider.connect(start_timeout_sec=5)
    run_id = f"faults-{secrets.token_hex(4)}"
    try:
        with pytest.raises(ImageBuildError):
            await provider.create(
                spec_for(plain_task(), run_id=run_id, image="rolltap-test/gone:x")
            )
        with pytest.raises(SandboxStartError) as no_shell:
            await provider.create(spec_for(plain_task(), run_id=run_id, image=empty))
        async with fake_proxy() as (sock, _):
            spec = spec_for(plain_task(), run_id=run_id, image=no_python, proxy_socket=sock)
            with pytest.raises(SandboxStartError) as no_forwarder:
                await provider.create(spec)
        leftovers = await provider.sweep(run_id)
    finally:
        await provider.close()

    assert not isinstance(no_shell.value, ImageBuildError)
    assert "python3" in str(no_forwarder.value)
    assert leftovers == 0


def _import_empty_image(raw: docker.APIClient, tag: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("etc")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    repo, _, version = tag.partition(":")
    raw.import_image_from_data(buf.getvalue(), repository=repo, tag=version)


def _runner_script(body: str) -> str:
    """A runner process that does `body` (async) and then gets killed by the test."""
    head = """
        import asyncio
        from pathlib import Path
        from tests.support.sandboxes import plain_task, spec_for

        async def main():
    """
    indented = textwrap.indent(textwrap.dedent(body), "    ")
    return textwrap.dedent(head) + indented + "\nasyncio.run(main())\n"
