"""A rollout's status is chosen in one module, store/lifecycle.py: every other module reports what
happened (store/events.py) through `Store.report`, and none writes a status or the rules a write
is resolved under. Read as text (ast), like tests/cli/test_layout.py, without importing anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OWNER = ROOT / "store" / "lifecycle.py"
OUTSIDE = {"tests", "bench", "docs", ".venv", "build", "dist", ".git", ".ci"}
SCRIPT_FOLDERS = {"examples", "migrations", "harness_images"}
WRITES = {"update_rollout", "report", "UpdateRollout", "_update_rollout", "_write"}
"""The store's writes of a rollout (store/store.py, store/writer.py)."""
FLAGS = {"only_from", "keep_ending"}
"""The rules a write is resolved under (lifecycle.Change): the owner's alone to choose."""


def _sources() -> list[Path]:
    files = sorted(ROOT.glob("*.py"))
    for package in sorted(ROOT.iterdir()):
        if (package / "__init__.py").is_file() and package.name not in OUTSIDE | SCRIPT_FOLDERS:
            files += sorted(package.rglob("*.py"))
    return files


def _called(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return node.func.id if isinstance(node.func, ast.Name) else None


def _names_status(node: ast.expr) -> bool:
    """A dict display with a "status" key (spread into a write with **)."""
    return isinstance(node, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value == "status" for k in node.keys
    )


def _is_status_member(node: ast.expr | None) -> bool:
    """`RolloutStatus.X` (or its value), however the enum is reached."""
    if isinstance(node, ast.Attribute) and node.attr == "value":
        node = node.value
    return isinstance(node, ast.Attribute) and (
        (isinstance(node.value, ast.Name) and node.value.id == "RolloutStatus")
        or (isinstance(node.value, ast.Attribute) and node.value.attr == "RolloutStatus")
    )


def status_writes(source: str) -> list[str]:
    """Where `source` chooses a rollout's status or a write's rule, one line each."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call):
            called = _called(node)
            if called in WRITES:
                if any(k.arg == "status" for k in node.keywords):
                    found.append(f"line {line}: {called}(status=...)")
                if any(k.arg is None and _names_status(k.value) for k in node.keywords):
                    found.append(f"line {line}: {called}(**{{'status': ...}})")
            if called == "Change" and (node.args or any(k.arg in FLAGS for k in node.keywords)):
                found.append(f"line {line}: Change(...) with a write's rule")
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                key = target.slice if isinstance(target, ast.Subscript) else None
                status_key = isinstance(key, ast.Constant) and key.value == "status"
                to_status = isinstance(target, ast.Attribute) and target.attr == "status"
                if (to_status or status_key) and _is_status_member(node.value):
                    found.append(f"line {line}: a status assigned")
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == "status" and _is_status_member(v):
                    found.append(f"line {line}: {{'status': RolloutStatus...}}")
        named = (
            (isinstance(node, ast.Name) and node.id in FLAGS)
            or (isinstance(node, ast.Attribute) and node.attr in FLAGS)
            or (isinstance(node, ast.keyword) and node.arg in FLAGS)
            or (isinstance(node, ast.arg) and node.arg in FLAGS)
        )
        if named:
            found.append(f"line {line}: names a write's rule ({'/'.join(sorted(FLAGS))})")
    return found


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_lifecycle_chooses_a_rollout_s_status(path: Path) -> None:
    if path == OWNER:
        return
    found = status_writes(path.read_text())
    assert not found, f"{path.relative_to(ROOT)} chooses a status: {found}"


def test_the_owner_is_where_the_choices_are() -> None:
    """The check reads the owner as any other module and finds its choices there: it is not
    blind."""
    assert status_writes(OWNER.read_text())


@pytest.mark.parametrize(
    "written",
    [
        "await store.update_rollout(rid, status=RolloutStatus.CANCELLED, error='x')",
        "await ctx.store.report(rid, event, status='finished')",
        "await store.update_rollout(rid, **{'status': 'failed'})",
        "await store.update_rollout(rid, only_from=OPEN, merge_meta={})",
        "view = await store.update_rollout(rid, keep_ending=True, reward=1.0)",
        "change = lifecycle.Change(allowed, True)",
        "change = Change(only_from=frozenset({'pending'}))",
        "state.status = RolloutStatus.CANCELLED",
        "state.status = store.RolloutStatus.RUNNING",
        "values['status'] = RolloutStatus.CANCELLED.value",
        "values |= {'status': RolloutStatus.CANCELLED, 'error': why}",
        "def end(rid: str, keep_ending: bool) -> None: ...",
    ],
)
def test_each_way_of_choosing_a_status_is_found(written: str) -> None:
    assert status_writes(written), written


@pytest.mark.parametrize(
    "read",
    [
        "await store.report(rid, Cancelled(why))",
        "await store.update_rollout(rid, merge_meta={'k': 1}, reward=1.0)",
        "change = lifecycle.Change(merge_meta=meta)",
        "state.status = status_of(event)",
        "views = await store.rollouts(batch=b, status=['pending'])",
        "if view.status is RolloutStatus.FINISHED: done += 1",
        "return web.json_response(body, status=503)",
        "data['status'] = view.status.value",
        "item['status'] = 'completed'",
    ],
)
def test_reading_a_status_is_not_choosing_one(read: str) -> None:
    assert not status_writes(read), read
