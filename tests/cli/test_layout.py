"""Every import in the package tree names its file: read as text, each one resolves on disk.

rolltap/ links the card's top-level folders in (rolltap/proxy -> ../proxy), so an import name is a
path; inside the tree imports are relative (docs/layout.md). This reads every module as text, the
way a reader or a structure-drawing tool would, without importing anything.
"""

from __future__ import annotations

import ast
import os
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rolltap"
# The folders rolltap/ links in, each by its own name.
LINKED = sorted(p.name for p in PACKAGE.iterdir() if p.is_symlink())
# Imported from elsewhere and run as scripts (examples, alembic's env): absolute imports there.
SCRIPT_FOLDERS = {"examples", "migrations", "harness_images"}
COMPONENTS = [name for name in LINKED if name not in SCRIPT_FOLDERS]


def _sources() -> list[Path]:
    files = [p for p in PACKAGE.rglob("*.py") if not _through_link(p)]
    for name in COMPONENTS:
        files += (ROOT / name).rglob("*.py")
    return sorted(files)


def _through_link(path: Path) -> bool:
    return any((PACKAGE / part).is_symlink() for part in path.relative_to(PACKAGE).parts[:1])


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


def test_the_package_links_every_top_level_component() -> None:
    for name in LINKED:
        assert os.readlink(PACKAGE / name) == f"../{name}", name
    expected = {"proxy", "store", "runner", "engine", "analysis", "audit", "export", "chatformat"}
    assert expected <= set(COMPONENTS)
    assert "extend_path" not in (PACKAGE / "__init__.py").read_text()


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_import_resolves_as_text(path: Path) -> None:
    component = path.relative_to(ROOT).parts[0] != "rolltap"
    wrong: list[str] = []
    for node in _imports(path):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            names = [a.name for a in node.names]
            # Resolved from the file's own folder, not through a link: a component's
            # `..store` is the top-level store/ beside it; above the checkout is an error.
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
            if parts[0] != "rolltap" or len(parts) == 1:
                continue
            if (parts[1] in LINKED and parts[1] not in SCRIPT_FOLDERS) or not component:
                # Inside the tree a component (or rolltap/ itself) is reached relatively.
                wrong.append(f"line {node.lineno}: absolute import of {module}")
            elif not _resolves(PACKAGE, ".".join(parts[1:]), []):
                wrong.append(f"line {node.lineno}: {module} names no file under rolltap/")
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
                folder = PACKAGE.joinpath(*parts[1:])
            subs = [_module_file(folder / a.name) for a in names]
            found.update(s for s in subs if s is not None)
            own = _module_file(folder)
            if own is not None and (not names or None in subs):
                found.add(own)
    found.discard(path.resolve())
    return found
