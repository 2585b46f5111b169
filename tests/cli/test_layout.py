"""Every import in the package tree names its file: read as text, each one resolves on disk.

The repository root is the `rolltap` package (package-dir = {"rolltap" = "."}), so an import name
is a path from the root by Python's own rules, with no link in between; inside the tree imports
are relative (docs/layout.md). This reads every module as text, the way a reader or a
structure-drawing tool would, without importing anything.
"""

from __future__ import annotations

import ast
import subprocess
import tomllib
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Not the package's: the tests, the benchmarks, the docs, and what an install or a run leaves.
OUTSIDE = {"tests", "bench", "docs", ".venv", "build", "dist", ".git", ".ci"}
# Imported from elsewhere and run as scripts (examples, alembic's env): absolute imports there.
SCRIPT_FOLDERS = {"examples", "migrations", "harness_images"}
COMPONENTS = sorted(
    p.name
    for p in ROOT.iterdir()
    if (p / "__init__.py").is_file() and p.name not in OUTSIDE | SCRIPT_FOLDERS
)


def _sources() -> list[Path]:
    files = sorted(ROOT.glob("*.py"))
    for name in COMPONENTS:
        files += sorted((ROOT / name).rglob("*.py"))
    return files


def _resolves(base: Path, dotted: str | None, names: list[str]) -> bool:
    target = base.joinpath(*dotted.split(".")) if dotted else base
    if dotted is None:
        # `from . import x`: x is a module beside the file, or a name of the package itself.
        modules = all(
            (base / f"{n}.py").is_file() or (base / n / "__init__.py").is_file() for n in names
        )
        return modules or (base / "__init__.py").is_file()
    return target.with_suffix(".py").is_file() or (target / "__init__.py").is_file()


def _imports(path: Path) -> list[ast.Import | ast.ImportFrom]:
    tree = ast.parse(path.read_text(), str(path))
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def test_the_root_is_the_package_and_the_tree_holds_no_link() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {"rolltap": "."}
    expected = {"proxy", "store", "runner", "engine", "analysis", "audit", "export", "chatformat"}
    assert expected <= set(COMPONENTS)
    assert {"cli", "ui", "loops"} <= set(COMPONENTS)
    tracked = subprocess.run(
        ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout
    links = [line.split("\t")[-1] for line in tracked.splitlines() if line.startswith("120000")]
    assert not links, links
    on_disk = [
        str(p.relative_to(ROOT))
        for name in COMPONENTS
        for p in (ROOT / name).rglob("*")
        if p.is_symlink()
    ]
    assert not on_disk, on_disk


def test_the_root_init_imports_nothing() -> None:
    """pytest imports the root __init__.py once more under the checkout folder's name (a package
    above tests/): it stays import-free, so that second copy is a docstring and a version."""
    assert not _imports(ROOT / "__init__.py")
    assert "extend_path" not in (ROOT / "__init__.py").read_text()


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_import_resolves_as_text(path: Path) -> None:
    wrong: list[str] = []
    for node in _imports(path):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            names = [a.name for a in node.names]
            # Resolved from the file's own folder: a component's `..store` is the top-level
            # store/ beside it; above the checkout is an error.
            shown = f"line {node.lineno}: {'.' * node.level}{node.module or ''}"
            if ROOT not in (base, *base.parents):
                wrong.append(f"{shown} leaves the tree")
            elif not _resolves(base, node.module, names):
                wrong.append(f"{shown} names no file")
            continue
        modules = (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        )
        for module in modules:
            parts = module.split(".")
            if parts[0] in COMPONENTS or (parts[0] == "rolltap" and len(parts) > 1):
                # Inside the tree the package is reached relatively; a bare `proxy` or
                # `store` would be a second copy of a component under another name.
                wrong.append(f"line {node.lineno}: absolute import of {module}")
    assert not wrong, wrong


def test_script_folders_reach_the_package_by_its_name() -> None:
    """examples/, migrations/ and harness_images/ are run as scripts too: their imports of the
    package are absolute and each names a file under the root."""
    wrong: list[str] = []
    for name in SCRIPT_FOLDERS:
        for path in (ROOT / name).rglob("*.py"):
            for node in _imports(path):
                if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                    continue
                parts = node.module.split(".")
                named = parts[0] == "rolltap" and len(parts) > 1
                if named and not _resolves(ROOT, ".".join(parts[1:]), []):
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}")
    assert not wrong, wrong


def test_no_module_imports_itself_back() -> None:
    """No import cycle, counting every import statement: function-level and TYPE_CHECKING ones
    too, since a reader follows those arrows as well (a cycle is a knot in the picture)."""
    graph = {path: _targets(path) for path in _sources()}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as e:
        cycle = [str(p.relative_to(ROOT)) for p in e.args[1]]
        raise AssertionError(f"import cycle: {' -> '.join(cycle)}") from None


def _module_file(target: Path) -> Path | None:
    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
        if candidate.is_file():
            return candidate.resolve()
    return None


def _targets(path: Path) -> set[Path]:
    """The files a module's imports name (a package's __init__ only where a name is not a
    submodule of it)."""
    found: set[Path] = set()
    for node in _imports(path):
        if isinstance(node, ast.Import):
            pairs = [(a.name.split("."), []) for a in node.names]
        elif node.level:
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            dotted = node.module.split(".") if node.module else []
            pairs = [([*base.relative_to(ROOT).parts, *dotted], node.names)]
        else:
            pairs = [((node.module or "").split("."), node.names)]
        for parts, names in pairs:
            if parts and parts[0] != "rolltap" and not (ROOT / parts[0]).is_dir():
                continue  # another distribution's module
            folder = ROOT.joinpath(*parts)
            if parts and parts[0] == "rolltap":
                folder = ROOT.joinpath(*parts[1:])
            subs = [_module_file(folder / a.name) for a in names]
            found.update(s for s in subs if s is not None)
            own = _module_file(folder)
            if own is not None and (not names or None in subs):
                found.add(own)
    found.discard(path.resolve())
    return found
