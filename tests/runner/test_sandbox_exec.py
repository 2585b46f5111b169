"""What every sandbox kind does alike: commands, output, copies, persistence, cleanup."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from rolltap.runner.sandboxes.base import LOG_DIRS, Mount, Sandbox, SandboxProvider
from rolltap.runner.sandboxes.errors import SandboxCopyError, SandboxExecError
from rolltap.runner.sandboxes.kinds import make_provider
from tests.support.sandboxes import KINDS, open_provider, plain_task, spec_for


@pytest_asyncio.fixture(params=KINDS, loop_scope="function")
async def provider(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[SandboxProvider]:
    opened = await open_provider(request.param, tmp_path / "workspaces")
    yield opened
    await opened.close()


@pytest_asyncio.fixture(loop_scope="function")
async def sandbox(provider: SandboxProvider) -> AsyncIterator[Sandbox]:
    created = await provider.create(spec_for(plain_task(), env={"FROM_SPEC": "spec"}))
    yield created
    await created.close()


async def test_a_script_runs_in_the_workdir_with_separate_streams(sandbox: Sandbox) -> None:
    result = await sandbox.exec("pwd; echo out; echo err >&2; exit 3")

    assert result.exit_code == 3
    assert not result.timed_out
    assert result.stdout.splitlines()[-1] == "out"
    assert result.stdout.splitlines()[0].endswith("/app")
    assert result.stderr == "err\n"


async def test_argv_env_cwd_and_stdin_reach_the_command(sandbox: Sandbox) -> None:
    await sandbox.exec("mkdir -p /app/sub")
    result = await sandbox.exec(
        ["bash", "-c", 'echo "$FROM_SPEC $FROM_EXEC $(basename "$PWD")"; cat'],
        env={"FROM_EXEC": "exec"},
        cwd="/app/sub",
        stdin=b"piped in",
    )

    assert result.ok
    assert result.stdout == "spec exec sub\npiped in"


async def test_the_environment_is_not_the_runners(sandbox: Sandbox, monkeypatch) -> None:
    monkeypatch.setenv("ROLLTAP_SECRET_OF_THE_RUNNER", "leak")
    result = await sandbox.exec("env")

    assert result.ok
    assert "ROLLTAP_SECRET_OF_THE_RUNNER" not in result.stdout


async def test_the_standard_layout_exists_and_is_writable(sandbox: Sandbox) -> None:
    dirs = " ".join([sandbox.workdir, *LOG_DIRS])
    result = await sandbox.exec(f"for d in {dirs}; do touch $d/x || exit 1; done; echo ok > ~/y")

    assert result.ok, result.stderr


async def test_what_one_command_leaves_the_next_one_sees(sandbox: Sandbox) -> None:
    await sandbox.exec(
        "echo kept > /app/state.txt; echo tmp > /tmp/t.txt; echo log > /logs/agent/l"
    )
    result = await sandbox.exec("cat /app/state.txt /tmp/t.txt /logs/agent/l")

    assert result.stdout == "kept\ntmp\nlog\n"


async def test_large_output_is_captured_in_full_and_streamed_to_the_log(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    log = tmp_path / "exec.log"
    result = await sandbox.exec(
        "python3 -c \"import sys; sys.stdout.write('x' * 3_000_000); sys.stderr.write('e')\"",
        log=log,
    )

    assert result.ok
    assert len(result.stdout) == 3_000_000
    assert sorted(log.read_bytes()) == sorted(b"x" * 3_000_000 + b"e")


async def test_put_and_get_copy_files_and_directories(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "deep").mkdir(parents=True)
    (src / "a.txt").write_text("A")
    (src / "deep" / "b.txt").write_text("B")
    single = tmp_path / "single.txt"
    single.write_text("S")

    await sandbox.put(src, "/tests")
    await sandbox.put(single, "/app/nested/copy.txt")
    inside = await sandbox.exec("cat /tests/a.txt /tests/deep/b.txt /app/nested/copy.txt")
    await sandbox.exec("mkdir -p /logs/verifier/d && echo R > /logs/verifier/d/r.txt")
    await sandbox.get("/logs/verifier", tmp_path / "out")
    await sandbox.get("/app/nested/copy.txt", tmp_path / "back.txt")

    assert inside.stdout == "ABS"
    assert (tmp_path / "out" / "d" / "r.txt").read_text() == "R\n"
    assert (tmp_path / "back.txt").read_text() == "S"


async def test_getting_a_missing_path_is_a_copy_error(sandbox: Sandbox, tmp_path: Path) -> None:
    with pytest.raises(SandboxCopyError):
        await sandbox.get("/app/missing.txt", tmp_path / "x")


async def test_a_read_only_mount_is_visible_at_its_path(
    provider: SandboxProvider, tmp_path: Path
) -> None:
    prefix = tmp_path / "harness-prefix"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "tool").write_text("#!/bin/sh\necho tool ran\n")
    (prefix / "bin" / "tool").chmod(0o755)
    spec = spec_for(plain_task(), mounts=(Mount(prefix, str(prefix)),))
    box = await provider.create(spec)
    try:
        ran = await box.exec([str(prefix / "bin" / "tool")])
        write = await box.exec(f"touch {prefix}/bin/new")
    finally:
        await box.close()

    assert ran.stdout == "tool ran\n"
    if provider.kind != "local":
        assert write.exit_code != 0
        assert not (prefix / "bin" / "new").exists()


async def test_sweep_removes_what_a_run_left_behind(provider: SandboxProvider) -> None:
    left = [await provider.create(spec_for(plain_task(), run_id="crashed-run")) for _ in range(2)]
    other = await provider.create(spec_for(plain_task(), run_id="other-run"))
    try:
        swept = await provider.sweep("crashed-run")
        again = await provider.sweep("crashed-run")
        still = await other.exec("echo alive")
    finally:
        for box in [*left, other]:
            await box.close()

    assert swept == 2
    assert again == 0
    assert still.stdout == "alive\n"


async def test_kinds_are_made_by_name(tmp_path: Path) -> None:
    local = await make_provider("local", root=tmp_path)

    assert local.kind == "local"
    with pytest.raises(ValueError, match="unknown sandbox kind"):
        await make_provider("vm")


async def test_close_twice_is_harmless_and_then_commands_are_refused(
    provider: SandboxProvider,
) -> None:
    box = await provider.create(spec_for(plain_task()))
    await box.close()
    await box.close()

    with pytest.raises(SandboxExecError, match="closed"):
        await box.exec("true")
