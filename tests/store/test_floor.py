"""store/ is the floor: persistence only, it names no component above it (analysis/, audit/,
export/, runner/, proxy/, cli/, ui/ ...) in any form, so what reads a record builds on the store
and never the other way round (docs/layout.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "store"
# Besides its own modules, the store may use these basics: nothing of them imports a component.
BASICS = {"lazy", "loop_thread", "migrations"}
# The package's top-level names: its component folders and its root modules.
TOP = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()} | {
    p.stem for p in ROOT.glob("*.py")
}


def _outside_names(path: Path) -> list[str]:
    """Every name of the tree outside store/ that a store module imports or spells as a module
    string: module level, in a function, under TYPE_CHECKING, or for importlib."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level >= 2:
            if node.module:
                found.append(node.module.split(".")[0])
            else:
                found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom | ast.Import):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            modules += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [m.split(".")[1] for m in modules if m.startswith("rolltap.")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if text.startswith("..") and text[2:3].isalpha():
                found.append(text[2:].split(".")[0])
            elif text.startswith("rolltap.") and text.count(" ") == 0:
                found.append(text.split(".")[1])
    return [name for name in found if name in TOP - {"store"}]


def test_the_store_names_no_component_above_it() -> None:
    wrong = {
        str(path.relative_to(ROOT)): sorted(set(names) - BASICS)
        for path in sorted(STORE.rglob("*.py"))
        if set(names := _outside_names(path)) - BASICS
    }
    assert wrong == {}
