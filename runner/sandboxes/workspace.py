"""A sandbox's writable state on the host (local, bwrap and apptainer kinds): one directory per
rollout whose fs/ mirrors the writable inside paths, and copies in and out of it that never
follow a symlink the agent planted there.

A workspace may belong to another user than the runner (the sandbox user, when the runner is
root): then it and everything copied into it is handed to that user, and only that user and
root can enter it. Copies run only while no command runs in the sandbox (each command's
processes end with it in these kinds), so nothing can swap a path while the runner uses it."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .base import LOG_DIRS, Mount
from .errors import SandboxCopyError, SandboxStartError
from .identity import SandboxUser

# Writable inside paths besides the workdir: logs, what the runner copies in, temp and HOME.
WRITABLE_ROOTS = ("/logs", "/tests", "/solution", "/tmp", "/var/tmp", "/root")
HOME = "/root"


@dataclass(frozen=True)
class Workspace:
    dir: Path
    roots: tuple[str, ...]
    """Writable inside paths, none nested in another; each is fs/<path> on the host."""
    owner: SandboxUser | None = None
    """Who the files belong to when that is not the runner."""

    @property
    def fs(self) -> Path:
        return self.dir / "fs"

    def host_path(self, inside: str) -> Path:
        """Where an inside path lives on the host; SandboxCopyError outside the writable roots."""
        path = normalize(inside)
        if not any(path == r or path.startswith(r.rstrip("/") + "/") for r in self.roots):
            raise SandboxCopyError(f"{inside} is not in a writable path of this sandbox")
        return self.fs / path.lstrip("/")


def create_workspace(
    base: Path, run_id: str, rollout_id: str, workdir: str, owner: SandboxUser | None = None
) -> Workspace:
    """owner: hand the workspace to that user (the runner is root and the sandbox is not)."""
    if normalize(workdir) == "/":
        raise SandboxStartError("a workdir of / cannot be a writable workspace directory")
    run_dir = base / label(run_id)
    rollout_dir = run_dir / label(rollout_id)
    if rollout_dir.exists():
        # A rollout that starts again starts from a clean sandbox, as a fresh container would.
        shutil.rmtree(rollout_dir)
    base.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(exist_ok=True)
    rollout_dir.mkdir(mode=0o700)
    if owner is not None:
        # The sandbox user needs to pass through the run's directory; other users do not.
        os.chown(run_dir, -1, owner.gid)
        run_dir.chmod(0o750)
    ws = Workspace(rollout_dir, _outermost((normalize(workdir), *WRITABLE_ROOTS)), owner)
    for inside in (*ws.roots, normalize(workdir), *LOG_DIRS):
        ws.host_path(inside).mkdir(parents=True, exist_ok=True)
    hand_over(ws)
    return ws


def hand_over(ws: Workspace, path: Path | None = None) -> None:
    """Gives `path` (default: the whole workspace), and everything below it, to the workspace's
    owner; never follows a link."""
    if ws.owner is not None:
        _chown_tree(path or ws.dir, ws.owner)


def fresh_dir(ws: Workspace, inside: str) -> None:
    """Replaces an inside directory with a new empty one owned by the sandbox's user, whatever
    the agent left at that path or above it (files, or links planted to redirect it)."""
    path = ws.host_path(inside)
    _ensure_dir(path.parent, ws.fs)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    path.mkdir()
    hand_over(ws, path)


def locate(
    ws: Workspace, mounts: tuple[Mount, ...], inside: str, *, writing: bool
) -> tuple[Path, Path]:
    """The host path of an inside path, and the directory a copy must stay below."""
    path = normalize(inside)
    for m in mounts:
        if path == m.inside_path or path.startswith(m.inside_path.rstrip("/") + "/"):
            if writing and m.read_only:
                raise SandboxCopyError(f"{inside} is in a read-only mount")
            return m.host_path / os.path.relpath(path, m.inside_path), m.host_path
    return ws.host_path(path), ws.fs


def remove_workspace(ws: Workspace) -> None:
    shutil.rmtree(ws.dir, ignore_errors=True)


def sweep_workspaces(base: Path, run_id: str) -> int:
    run_dir = base / label(run_id)
    if not run_dir.is_dir():
        return 0
    count = sum(1 for _ in run_dir.iterdir())
    shutil.rmtree(run_dir, ignore_errors=True)
    return count


def label(value: str) -> str:
    """A file-name-safe form of an id; ids that had to change get a hash so they stay distinct."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", value)[:80].lstrip(".") or "_"
    if safe == value:
        return safe
    return f"{safe}-{hashlib.sha256(value.encode()).hexdigest()[:8]}"


def normalize(inside: str) -> str:
    path = PurePosixPath("/", inside)
    if ".." in path.parts:
        raise SandboxCopyError(f"{inside}: '..' is not allowed in sandbox paths")
    return str(path)


def copy_in(src: Path, dest: Path, fence: Path, owner: SandboxUser | None = None) -> None:
    """Copies a host file to dest, or a host directory's contents into dest (below fence);
    with an owner, what it creates belongs to that user."""
    if not src.exists():
        raise SandboxCopyError(f"{src} does not exist")
    created = _ensure_dir(dest.parent, fence)
    if src.is_dir():
        created += _ensure_dir(dest, fence)
        _merge(src, dest)
    else:
        _replace_link(dest)
        shutil.copy2(src, dest)
    if owner is not None:
        for path in created:
            _chown(path, owner)
        _chown_tree(dest, owner)


def copy_out(src: Path, dest: Path, fence: Path) -> None:
    """Copies src (below fence) to dest; symlinks are copied as links, never followed."""
    if not src.exists() and not src.is_symlink():
        raise SandboxCopyError(f"{src.relative_to(fence)} does not exist in the sandbox")
    real = Path(os.path.realpath(src))
    if not real.is_relative_to(os.path.realpath(fence)):
        raise SandboxCopyError(f"{src.relative_to(fence)} leads out of the sandbox")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if real.is_dir():
        shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dest, follow_symlinks=False)


def _ensure_dir(path: Path, fence: Path) -> list[Path]:
    """Makes path a real directory below fence (links on the way replaced); returns the
    directories it created."""
    created = []
    current = fence
    for part in path.relative_to(fence).parts:
        current = current / part
        _replace_link(current)
        if not current.exists():
            current.mkdir()
            created.append(current)
        elif not current.is_dir():
            raise SandboxCopyError(f"{current.relative_to(fence)} is a file, not a directory")
    return created


def _chown(path: Path, owner: SandboxUser) -> None:
    os.chown(path, owner.uid, owner.gid, follow_symlinks=False)


def _chown_tree(top: Path, owner: SandboxUser) -> None:
    _chown(top, owner)
    if top.is_dir() and not top.is_symlink():
        for dirpath, dirnames, filenames in os.walk(top):
            for name in (*dirnames, *filenames):
                _chown(Path(dirpath) / name, owner)


def _merge(src: Path, dest: Path) -> None:
    for entry in os.scandir(src):
        target = dest / entry.name
        _replace_link(target)
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.is_dir():
            target.mkdir(exist_ok=True)
            _merge(Path(entry.path), target)
        else:
            shutil.copy2(entry.path, target)


def _replace_link(path: Path) -> None:
    if path.is_symlink():
        path.unlink()


def _outermost(paths: tuple[str, ...]) -> tuple[str, ...]:
    unique = sorted(set(paths))
    return tuple(
        p for p in unique if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in unique)
    )
