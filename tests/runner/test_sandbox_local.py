"""What only the local kind does: rewriting the task's absolute paths to its workspace."""

from __future__ import annotations

from pathlib import Path

from rolltap.runner.sandboxes.base import Mount
from rolltap.runner.sandboxes.local import LocalSandbox, PathMap
from rolltap.runner.sandboxes.workspace import create_workspace
from tests.support.sandboxes import plain_task, provider_of, spec_for


def test_task_paths_map_to_the_workspace_and_nothing_else_does(tmp_path: Path) -> None:
    ws = create_workspace(tmp_path, "run", "rollout", "/app")
    paths = PathMap(ws, "/app", (Mount(Path("/opt/h"), "/harness"),))
    fs = ws.fs

    assert paths.text("cat /app/x /logs/verifier/r /tests/t.sh") == (
        f"cat {fs}/app/x {fs}/logs/verifier/r {fs}/tests/t.sh"
    )
    assert paths.text("cd /app; ls /application /var/logs /apps x/app") == (
        f"cd {fs}/app; ls /application /var/logs /apps x/app"
    )
    assert paths.text("'/app' \"/solution/solve.sh\" /harness/bin") == (
        f"'{fs}/app' \"{fs}/solution/solve.sh\" /opt/h/bin"
    )
    assert paths.path("/app/sub") == fs / "app" / "sub"


async def test_scripts_copied_into_tests_are_rewritten_but_task_files_are_not(
    tmp_path: Path,
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "test.sh").write_text("cat /app/data.txt > /logs/verifier/reward.txt\n")
    (src / "data.txt").write_text("1 /app\n")
    async with provider_of("local", tmp_path / "ws") as provider:
        box = await provider.create(spec_for(plain_task()))
        assert isinstance(box, LocalSandbox)
        try:
            await box.put(src / "data.txt", "/app/data.txt")
            await box.put(src, "/tests")
            ran = await box.exec(["bash", "/tests/test.sh"])
            await box.get("/logs/verifier/reward.txt", tmp_path / "reward.txt")
            home = await box.exec("echo $HOME")
        finally:
            await box.close()

    assert ran.ok, ran.stderr
    assert (tmp_path / "reward.txt").read_text() == "1 /app\n"
    assert home.stdout.strip().startswith(str(tmp_path / "ws"))
