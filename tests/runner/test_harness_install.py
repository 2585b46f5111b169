"""Installing harnesses into isolated prefixes, for real (venv + pip, npm), on tiny packages."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from rolltap.cli.main import cli
from rolltap.runner.harnesses import (
    Dialect,
    HarnessExit,
    Installation,
    Launch,
    NotInstalled,
    Outcome,
    RunContext,
    harness_root,
    install,
    installation,
)
from rolltap.runner.harnesses.base import NpmPackages, Packages, PythonPackages
from rolltap.runner.harnesses.install import read_record, tree_size


class TinyHarness:
    """A stand-in adapter whose packages install in seconds."""

    dialect: Dialect = "chat"

    def __init__(self, name: str, packages: Packages) -> None:
        self.name = name
        self.packages = packages

    def launch(self, ctx: RunContext, installation: Installation) -> Launch:
        raise NotImplementedError

    def classify(self, ctx: RunContext, exit: HarnessExit) -> Outcome:
        raise NotImplementedError


def test_the_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ROLLTAP_HARNESS_DIR", str(tmp_path / "h"))
    assert harness_root() == tmp_path / "h"
    monkeypatch.delenv("ROLLTAP_HARNESS_DIR")
    assert harness_root().parts[-2:] == ("rolltap", "harnesses")


@pytest.mark.slow
def test_a_python_harness_gets_its_own_venv(tmp_path: Path) -> None:
    tiny = TinyHarness("tiny-py", PythonPackages(("six==1.16.0",), python=(3, 10)))
    with pytest.raises(NotInstalled):
        installation(tiny, tmp_path)

    record = install(tiny, tmp_path)
    found = installation(tiny, tmp_path)

    python = Path(found.bin_dir) / "python"
    done = subprocess.run(
        [python, "-c", "import six, sys; print(sys.prefix)"], capture_output=True, text=True
    )
    assert done.stdout.strip() == str(tmp_path / "tiny-py" / "venv")
    assert found.mounts[0] == found.prefix
    base = subprocess.run(
        [python, "-c", "import sys; print(sys.base_prefix)"], capture_output=True, text=True
    ).stdout.strip()
    # The interpreter's own tree is a mount unless it lives on the host's read-only root.
    on_root = base == "/usr" or base.startswith("/usr/")
    assert [str(m) for m in found.mounts[1:]] == ([] if on_root else [base])
    assert record.size_bytes == tree_size(tmp_path / "tiny-py") - len(
        (tmp_path / "tiny-py" / "rolltap-install.json").read_bytes()
    )
    assert install(tiny, tmp_path).installed_at == record.installed_at
    assert install(tiny, tmp_path, force=True).installed_at > record.installed_at


@pytest.mark.slow
def test_a_node_harness_gets_its_own_npm_prefix(tmp_path: Path) -> None:
    tiny = TinyHarness("tiny-node", NpmPackages(("is-number@7.0.0",)))

    install(tiny, tmp_path)
    found = installation(tiny, tmp_path)

    package = Path(found.prefix) / "node_modules" / "is-number" / "package.json"
    assert json.loads(package.read_text())["version"] == "7.0.0"
    assert str(found.bin_dir).endswith("node_modules/.bin")
    assert found.path, "node's directory goes on PATH"


def test_changed_requirements_make_an_install_outdated(tmp_path: Path) -> None:
    old = TinyHarness("tiny", PythonPackages(("six==1.15.0",)))
    new = TinyHarness("tiny", PythonPackages(("six==1.16.0",)))
    (tmp_path / "tiny").mkdir()
    record = {
        "name": "tiny",
        "requirements": ["six==1.15.0"],
        "prefix": str(tmp_path / "tiny"),
        "bin_dir": str(tmp_path / "tiny/venv/bin"),
        "mounts": [str(tmp_path / "tiny")],
        "path": [],
        "seconds": 1.0,
        "size_bytes": 1,
        "installed_at": 0.0,
    }
    (tmp_path / "tiny" / "rolltap-install.json").write_text(json.dumps(record))

    assert installation(old, tmp_path).prefix.name == "tiny"
    with pytest.raises(NotInstalled, match="rolltap harness install tiny"):
        installation(new, tmp_path)
    assert read_record("tiny", tmp_path) is not None


def test_cli_lists_every_harness(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ROLLTAP_HARNESS_DIR", str(tmp_path))
    result = CliRunner().invoke(cli, ["harness", "list"])

    assert result.exit_code == 0, result.output
    assert str(tmp_path) in result.output
    for name in ("mini-swe-agent", "openhands", "qwen-code", "opencode", "codex", "claude-code"):
        assert f"{name} " in result.output
    assert result.output.count("not installed") == 6


def test_cli_rejects_an_unknown_harness(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ROLLTAP_HARNESS_DIR", str(tmp_path))
    result = CliRunner().invoke(cli, ["harness", "install", "nope"])

    assert result.exit_code == 1
    assert "unknown harness 'nope'" in result.output
