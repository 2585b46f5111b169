"""The house's import contracts (pyproject.toml, [tool.importlinter], run by import-linter in CI)
hold on this tree, and each one fails when a probe import that breaks it is added to a copy of
the tree: a contract that cannot fail checks nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = str(Path(sys.executable).parent / "lint-imports")
CONTRACTS = {
    c["id"]: c
    for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
}
# contract -> (a file of the package, an import that breaks only what that contract forbids)
PROBES = {
    "floors": ("store/ids.py", "from ..runner import tasks"),
    "store-is-persistence": ("store/ids.py", "from ..export import columns"),
    "nothing-imports-the-faces": ("runner/plan.py", "from ..cli import console"),
    "chatformat-knows-no-engine": ("chatformat/tools.py", "from ..engine import errors"),
    "client-is-light": ("wire.py", "from .store import enums"),
    "upstream-is-below": ("proxy/upstream/sse.py", "from ..dialects import chat"),
    "proxy-floors": ("proxy/errors.py", "from . import intake"),
}
OUTSIDE = {"tests", "bench", "docs", ".venv", ".git", "build", "dist", ".ci"}


def _lint(parent: Path, config: Path, *contract: str) -> subprocess.CompletedProcess[str]:
    """import-linter over the package found at parent/rolltap (a path beats the editable
    install's finder, which is consulted after the path)."""
    args = [LINT, "--config", str(config), "--no-cache"]
    for one in contract:
        args += ["--contract", one]
    env = {**os.environ, "PYTHONPATH": str(parent)}
    return subprocess.run(
        args, cwd=parent, env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's Python files under <tmp>/rolltap, as import-linter reads them."""
    parent = tmp_path_factory.mktemp("house")
    for path in ROOT.rglob("*.py"):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in OUTSIDE:
            continue
        target = parent / "rolltap" / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    shutil.copyfile(ROOT / "pyproject.toml", parent / "pyproject.toml")
    return parent


def test_every_contract_is_probed() -> None:
    assert set(PROBES) == set(CONTRACTS)


def test_the_tree_keeps_every_contract(copy: Path) -> None:
    result = _lint(copy, copy / "pyproject.toml")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in result.stdout


@pytest.mark.parametrize("contract", sorted(PROBES))
def test_a_probe_import_breaks_the_contract(copy: Path, contract: str) -> None:
    file, line = PROBES[contract]
    target = copy / "rolltap" / file
    kept = target.read_text()
    try:
        target.write_text(f"{kept}\n{line}  # noqa\n")
        result = _lint(copy, copy / "pyproject.toml", contract)
    finally:
        target.write_text(kept)
    assert result.returncode != 0, result.stdout[-2000:]
    assert f"{CONTRACTS[contract]['name']} BROKEN" in result.stdout
