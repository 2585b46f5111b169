"""The built wheel holds every package and its data, and works without the source tree: the
import names map onto the top-level folders, migrations run, example tasks and harness
Dockerfiles are there."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

# Run from the unpacked wheel only: drop the editable install's finder and the checkout.
PROBE = """
import sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path = [p for p in sys.path if p not in ("", {root!r}) and "__editable__" not in p]
sys.path.insert(0, {target!r})
import rolltap, rolltap.proxy.app, rolltap.store, rolltap.runner.batch, rolltap.engine.launch
import rolltap.runner.harnesses.images, rolltap.examples, rolltap.migrations
from pathlib import Path
for module in (rolltap, rolltap.proxy.app, rolltap.store, rolltap.runner.batch, rolltap.examples):
    assert module.__file__.startswith({target!r}), module.__file__
import asyncio
from rolltap.store import Store, migrate
async def main():
    store = await Store.connect({db!r})
    assert await migrate.current_revision(store.db) == migrate.head_revision()
    await store.close()
asyncio.run(main())
from rolltap.runner.harnesses.images import dockerfile
from rolltap.runner.harnesses import adapter
assert dockerfile(adapter("mini-swe-agent")).is_file()
from rolltap.runner.tasks import load_tasks
tasks = load_tasks(Path(rolltap.examples.__file__).parent / "tasks")
assert len(tasks) >= 12, len(tasks)
print("ok", len(tasks))
"""


def test_built_wheel_imports_and_carries_its_data(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = dist.glob("rolltap-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for required in (
        "rolltap/cli/main.py",
        "rolltap/proxy/app.py",
        "rolltap/store/writer.py",
        "rolltap/runner/batch.py",
        "rolltap/engine/batcher.py",
        "rolltap/migrations/env.py",
        "rolltap/migrations/script.py.mako",
        "rolltap/examples/tasks/hello-file/tests/test.sh",
        "rolltap/harness_images/codex/Dockerfile",
        "rolltap/ui/templates/rollout.html",
        "rolltap/ui/static/ui.js",
    ):
        assert required in names, required
    assert any(n.startswith("rolltap/migrations/versions/2026") for n in names)
    assert not any(n.startswith(("proxy/", "store/", "runner/")) for n in names)

    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    probe = PROBE.format(
        root=str(ROOT), target=str(target), db=f"sqlite:///{tmp_path / 's.sqlite'}"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")
