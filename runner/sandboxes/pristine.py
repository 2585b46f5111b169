"""The task's test files in the workdir, kept as its setup left them and put back before the
verifier runs (stdlib only, run inside the sandbox; any Python from 3.7: images bring their own).

    python3 -I -S pristine.py keep WORKDIR OUT      # copies them to OUT/tree, lists them in
                                                    # OUT/manifest.json
    python3 -I -S pristine.py restore WORKDIR KEPT  # KEPT as `keep` made it (copied back in);
                                                    # prints what it changed, a JSON list,
                                                    # and removes KEPT

What counts as the task's tests (looked for everywhere in the workdir but .git, site-packages,
dist-packages, node_modules and __pycache__):

- directories named `tests` or `test`: all of their contents;
- files named `conftest.py`, `test_*.py`, `*_test.py`, `pytest.ini`, `.pytest.ini`, `tox.ini`;
- `sitecustomize.py` and `usercustomize.py`, which Python runs at startup from a directory on
  sys.path (the workdir, where a test.sh puts it on PYTHONPATH);
- `entry_points.txt` of a `*.dist-info` or `*.egg-info`, where pytest finds plugins to load;
- `pyproject.toml` and `setup.cfg`, for their pytest configuration only.

`restore` puts every kept directory back in place of what is there now (whatever the agent added
to it goes, its `__pycache__` too), and every kept file (its compiled copies in `__pycache__` go,
so a planted .pyc cannot stand in for it); a link planted on the way is replaced by a directory.
Of what the agent created, it removes every `conftest.py`, pytest or tox configuration file,
`sitecustomize.py` and `usercustomize.py`, every pytest plugin entry point, a `pyproject.toml` or
`setup.cfg` with pytest configuration, and, at the top of the workdir (and of its `src/`), a
module named like a test runner's (a `pytest.py` there is what `python -m pytest` runs). A module
named like one of Python's own stays: an honest solution may be a `calendar.py`, and one that
shadows a module the test runner imports breaks the runner for the honest agent too. A
`pyproject.toml` or `setup.cfg` the task had comes back only if its pytest configuration changed.
Other new files stay (a new `test_*.py` too: a task may ask for tests).
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import stat
import sys
from collections.abc import Iterator

TEST_DIRS = ("tests", "test")
SKIP_DIRS = (".git", "site-packages", "dist-packages", "node_modules", "__pycache__")
TEST_NAMES = ("conftest.py", "pytest.ini", ".pytest.ini", "tox.ini")
STARTUP_NAMES = ("sitecustomize.py", "usercustomize.py")
CONFIG_NAMES = ("pyproject.toml", "setup.cfg")
TEST_PATTERNS = ("test_*.py", "*_test.py")
RUNNERS = ("pytest", "_pytest", "pluggy", "py", "unittest", "nose", "nose2", "hypothesis")
NOT_SHADOWS = ("test", "tests", "__pycache__", "site-packages", "dist-packages")
"""A package of tests named `test` shadows only CPython's own regression tests."""
MANIFEST = "manifest.json"
TREE = "tree"
NOT_REPORTED = ("__pycache__", ".pytest_cache")


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("keep", "restore"):
        sys.stderr.write("usage: pristine.py keep|restore WORKDIR DIR\n")
        return 2
    mode, workdir, where = argv
    if mode == "keep":
        keep(workdir, where)
        return 0
    try:
        changes = restore(workdir, where)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    sys.stdout.write(json.dumps(changes) + "\n")
    return 0


def is_test_file(name: str, parent: str) -> bool:
    if name in TEST_NAMES or name in STARTUP_NAMES or name in CONFIG_NAMES:
        return True
    if name == "entry_points.txt":
        return parent.endswith((".dist-info", ".egg-info"))
    return any(fnmatch.fnmatchcase(name, p) for p in TEST_PATTERNS)


def walk(
    workdir: str, skip: frozenset[str] = frozenset(), *, restoring: bool = False
) -> tuple[list[str], list[str]]:
    """(test directories, test files) below workdir, relative to it; `skip`: directories
    (relative) not to look into. Restoring, directories the agent locked are opened (their
    owner, the verifier's user, may) and test directories are looked into too: what the agent
    made there is searched for what it may not add."""
    dirs, files = [], []
    for dirpath, dirnames, filenames in _walk(workdir, restoring):
        rel_dir = os.path.relpath(dirpath, workdir)
        for name in list(dirnames):
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if name in SKIP_DIRS or rel in skip:
                dirnames.remove(name)
            elif name in TEST_DIRS:
                dirs.append(rel)
                if not restoring:
                    dirnames.remove(name)
        for name in filenames:
            if is_test_file(name, dirpath) or name in TEST_DIRS:  # a link named tests: as is
                files.append(os.path.normpath(os.path.join(rel_dir, name)))
    return dirs, files


def _walk(top: str, opening: bool) -> Iterator[tuple[str, list[str], list[str]]]:
    """os.walk's (dirpath, dirnames, filenames), top down, links never followed (a link is a
    file here, whatever it points to); `opening`: a directory that cannot be listed is made
    readable to its owner first, else it is passed over."""
    try:
        entries = list(os.scandir(top))
    except PermissionError:
        if not opening:
            return
        _writable(top)
        try:
            entries = list(os.scandir(top))
        except OSError:
            return
    except OSError:
        return
    dirnames: list[str] = []
    filenames: list[str] = []
    for entry in entries:
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        (dirnames if is_dir else filenames).append(entry.name)
    yield top, dirnames, filenames
    for name in dirnames:
        yield from _walk(os.path.join(top, name), opening)


def keep(workdir: str, out: str) -> None:
    dirs, files = walk(workdir)
    tree = os.path.join(out, TREE)
    os.makedirs(tree, exist_ok=True)
    unreadable = []
    for rel in dirs:
        try:
            shutil.copytree(os.path.join(workdir, rel), os.path.join(tree, rel), symlinks=True)
        except (OSError, shutil.Error):
            unreadable.append(rel)  # the runner fetches it with the sandbox's own copy
    for rel in files:
        target = os.path.join(tree, rel)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(os.path.join(workdir, rel), target, follow_symlinks=False)
        except OSError:
            unreadable.append(rel)
    manifest = {
        "dirs": dirs,
        "files": files,
        "top": _listing(workdir),
        "src_top": _listing(os.path.join(workdir, "src")),
        "unreadable": unreadable,
    }
    with open(os.path.join(out, MANIFEST), "w") as f:
        json.dump(manifest, f)


def restore(workdir: str, kept: str) -> list[str]:
    with open(os.path.join(kept, MANIFEST)) as f:
        manifest = json.load(f)
    tree = os.path.join(kept, TREE)
    kept_files = set(manifest["files"])
    changes: list[str] = []
    for rel in manifest["dirs"]:
        target = os.path.join(workdir, rel)
        differ = _tree_changes(os.path.join(tree, rel), target, rel)
        changes += [c for c in differ if not any(p in NOT_REPORTED for p in c.split(os.sep))]
        _real_parents(workdir, rel)
        _remove(target)
        shutil.copytree(os.path.join(tree, rel), target, symlinks=True)
    for rel in manifest["files"]:
        if os.path.basename(rel) in CONFIG_NAMES:
            continue  # below: only when its pytest configuration changed
        source, target = os.path.join(tree, rel), os.path.join(workdir, rel)
        if _same(source, target):
            continue
        changes.append("restored " + rel)
        _put_back(workdir, rel, source)
    _, found = walk(workdir, frozenset(manifest["dirs"]), restoring=True)
    configs = {r for r in found + manifest["files"] if os.path.basename(r) in CONFIG_NAMES}
    for rel in sorted(configs):
        path, kept_copy = os.path.join(workdir, rel), os.path.join(tree, rel)
        had = rel in kept_files
        if _pytest_config(kept_copy if had else None) == _pytest_config(path):
            continue
        if had:
            changes.append("restored " + rel)
            _put_back(workdir, rel, kept_copy)
        else:
            changes.append("removed " + rel)
            _remove(path)
    for rel in found:
        name, path = os.path.basename(rel), os.path.join(workdir, rel)
        if name in CONFIG_NAMES or rel in kept_files:
            continue
        if name in TEST_NAMES or name in STARTUP_NAMES:
            changes.append("removed " + rel)
            _remove(path)
            _drop_compiled(path)
        elif name == "entry_points.txt" and _declares_pytest_plugins(path):
            changes.append("removed " + rel)
            _remove(path)
    shadows = _shadow_names()
    for top, listed in (("", manifest["top"]), ("src", manifest["src_top"])):
        for entry in _listing(os.path.join(workdir, top)):
            if entry in listed:
                continue
            path = os.path.join(workdir, top, entry)
            if _module_name(path) in shadows:
                changes.append("removed " + os.path.join(top, entry))
                _remove(path)
    return changes


def _listing(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path)) if not os.path.islink(path) else []
    except OSError:
        return []


def _tree_changes(kept: str, now: str, rel: str) -> list[str]:
    """What differs between a kept directory and what stands at its path now (compiled files
    and caches included)."""
    if os.path.islink(now) or not os.path.isdir(now):
        return ["restored " + rel]
    kept_entries, now_entries = _entries(kept), _entries(now)
    changes = []
    for entry in sorted(kept_entries | now_entries):
        if entry not in now_entries:
            changes.append("restored " + os.path.join(rel, entry))
        elif entry not in kept_entries:
            changes.append("removed " + os.path.join(rel, entry))
        elif not _same(os.path.join(kept, entry), os.path.join(now, entry)):
            changes.append("restored " + os.path.join(rel, entry))
    return changes


def _entries(top: str) -> set[str]:
    found = set()
    for dirpath, _, filenames in _walk(top, True):
        for name in filenames:
            found.add(os.path.relpath(os.path.join(dirpath, name), top))
    return found


def _same(a: str, b: str) -> bool:
    """Both links to the same place, or both regular files with the same bytes (modes aside:
    a copy through docker's archives may lose group write)."""
    try:
        sa, sb = os.lstat(a), os.lstat(b)
    except OSError:
        return False
    if stat.S_ISLNK(sa.st_mode) or stat.S_ISLNK(sb.st_mode):
        return (
            stat.S_ISLNK(sa.st_mode)
            and stat.S_ISLNK(sb.st_mode)
            and os.readlink(a) == os.readlink(b)
        )
    if not (stat.S_ISREG(sa.st_mode) and stat.S_ISREG(sb.st_mode)):
        return False
    if sa.st_size != sb.st_size:
        return False
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            while True:
                ca, cb = fa.read(1 << 16), fb.read(1 << 16)
                if ca != cb:
                    return False
                if not ca:
                    return True
    except OSError:
        return False


def _put_back(workdir: str, rel: str, source: str) -> None:
    target = os.path.join(workdir, rel)
    _real_parents(workdir, rel)
    _remove(target)
    shutil.copy2(source, target, follow_symlinks=False)
    _drop_compiled(target)


def _real_parents(workdir: str, rel: str) -> None:
    """Makes every directory on the way to workdir/rel a real one: a link (or a file) the agent
    put in the way would lead the restored file elsewhere."""
    current = workdir
    for part in os.path.dirname(rel).split(os.sep):
        if not part or part == ".":
            continue
        current = os.path.join(current, part)
        if os.path.islink(current) or (os.path.lexists(current) and not os.path.isdir(current)):
            _remove(current)
        if not os.path.lexists(current):
            os.mkdir(current)


def _drop_compiled(source: str) -> None:
    """The compiled copies of a module (pytest's rewritten ones too), which Python would trust
    in its place when they look current (or carry an unchecked hash)."""
    stem = os.path.splitext(os.path.basename(source))[0]
    cache = os.path.join(os.path.dirname(source), "__pycache__")
    for name in _listing(cache):
        if name.startswith(stem + "."):
            _remove(os.path.join(cache, name))


def _remove(path: str) -> None:
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or not os.path.isdir(path):
        try:
            os.unlink(path)
        except PermissionError:
            _writable(os.path.dirname(path))
            os.unlink(path)
        return
    _writable(path)
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=_retry)
    else:
        shutil.rmtree(path, onerror=_retry)


def _retry(function: object, path: str, _info: object) -> None:
    """rmtree's error handler: a directory the agent locked (mode 000) is its owner's to open."""
    _writable(os.path.dirname(path))
    if os.path.isdir(path) and not os.path.islink(path):
        _writable(path)
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _writable(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
        os.chmod(path, stat.S_IMODE(mode) | stat.S_IRWXU)
    except OSError:
        pass


def _pytest_config(path: str | None) -> object:
    """What a pyproject.toml or setup.cfg tells pytest (None: nothing, or no file). Without
    tomllib (Python < 3.11), and for setup.cfg, the whole text of a file naming pytest: the
    file then comes back whenever it changed."""
    if path is None or not os.path.isfile(path) or os.path.islink(path):
        return None if path is None or not os.path.lexists(path) else ("not a file",)
    with open(path, "rb") as f:
        data = f.read()
    if os.path.basename(path) == "pyproject.toml":
        try:
            import tomllib
        except ImportError:
            pass
        else:
            try:
                parsed = tomllib.loads(data.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                return ("unreadable", data)
            tool = parsed.get("tool")
            return tool.get("pytest") if isinstance(tool, dict) else None
    return data if b"pytest" in data.lower() else None


def _declares_pytest_plugins(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return b"pytest11" in f.read()
    except OSError:
        return True  # unreadable to us, maybe not to pytest


def _module_name(path: str) -> str | None:
    """The module a top-level entry would be imported as (None: none)."""
    name = os.path.basename(path)
    if os.path.isdir(path):
        if os.path.lexists(os.path.join(path, "__init__.py")) or os.path.lexists(
            os.path.join(path, "__init__.pyc")
        ):
            return name
        return None
    for suffix in (".py", ".pyc", ".pyw", ".so", ".pyd"):
        if name.endswith(suffix):
            return name.split(".", 1)[0]
    return None


def _shadow_names() -> set[str]:
    """The test runners' module names: a workdir module by one of them runs instead."""
    return set(RUNNERS) - set(NOT_SHADOWS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
