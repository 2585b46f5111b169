"""Read-only views of host directories that the sandbox user cannot look up.

A root runner's harness installs live under /root (mode 0700), and so does a pyenv Python a venv
was made from. The sandbox user starts bubblewrap and cannot traverse /root, so those directories
cannot be bind-mounted from where they are. Each one is mirrored once, as a tree of hard links
(the same files, nothing copied, unless the mirror is on another filesystem), below a directory
the sandbox user can reach, and mounted from there at its original path. The files keep their
owner and mode: the sandbox user reads them as any other user would, and writes none.

A mirror is keyed by its source's path, inode and modification time: a reinstall (a new
directory) gets a new mirror. A mirror whose source was replaced or removed is deleted once it
is a day old (a batch still running may have it mounted); `<key>.source` beside it names its
source.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import shutil
import time
from pathlib import Path

from .base import Mount
from .errors import SandboxStartError
from .identity import SandboxUser

MIRROR_ROOT = Path("/var/tmp/rolltap-mirrors")
"""Persistent across runs (/var/tmp), and usually on the filesystem of /root, so hard links
work."""
STALE_AFTER_SEC = 24 * 3600


class MountSources:
    """Where a provider binds each mount from: the path itself when the sandbox user can look
    it up, else its mirror (read-only mounts only), built once per provider and path."""

    def __init__(self, user: SandboxUser) -> None:
        self._user = user
        self._found: dict[Path, Path] = {}
        self._building = asyncio.Lock()

    async def resolve(self, mounts: tuple[Mount, ...]) -> dict[Path, Path]:
        for m in mounts:
            if m.host_path not in self._found:
                self._found[m.host_path] = await self._source(m)
        return {m.host_path: self._found[m.host_path] for m in mounts}

    async def _source(self, m: Mount) -> Path:
        if self._user.can_reach(m.host_path):
            return m.host_path
        if not m.read_only:
            raise SandboxStartError(
                f"mount source {m.host_path} is out of reach of the sandbox user"
                f" (uid {self._user.uid}); make its directories searchable by it"
            )
        async with self._building:
            if m.host_path in self._found:
                return self._found[m.host_path]
            try:
                return await asyncio.to_thread(mirror, m.host_path)
            except OSError as e:
                raise SandboxStartError(f"cannot mirror {m.host_path}: {e}") from e


def mirror(source: Path, root: Path = MIRROR_ROOT) -> Path:
    """A directory with the same tree as `source`, reachable by everyone; built once."""
    source = source.resolve()
    st = source.stat()
    key = hashlib.sha256(str(source).encode()).hexdigest()[:16]
    target = root / f"{key}-{st.st_ino}-{st.st_mtime_ns}"
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    draft = root / f".draft-{key}-{secrets.token_hex(4)}"
    try:
        _link_tree(source, draft)
        draft.chmod(st.st_mode & 0o7777)
        os.rename(draft, target)
    except OSError:
        shutil.rmtree(draft, ignore_errors=True)
        if not target.is_dir():  # another runner may have built it meanwhile
            raise
    (root / f"{key}.source").write_text(f"{source}\n")
    _collect(root)
    return target


def _collect(root: Path) -> None:
    """Deletes day-old mirrors whose source is gone or was replaced by a newer one."""
    cutoff = time.time() - STALE_AFTER_SEC
    for note in root.glob("*.source"):
        key = note.name.removesuffix(".source")
        source = Path(note.read_text().strip())
        current = None
        if source.is_dir():
            st = source.stat()
            current = root / f"{key}-{st.st_ino}-{st.st_mtime_ns}"
        mirrors = [m for m in root.glob(f"{key}-*") if m != current]
        for old in mirrors:
            if old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
        if current is None and not any(root.glob(f"{key}-*")):
            note.unlink(missing_ok=True)


def _link_tree(source: Path, dest: Path) -> None:
    dest.mkdir(mode=0o700)
    for entry in os.scandir(source):
        target = dest / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.is_dir():
            _link_tree(Path(entry.path), target)
            target.chmod(entry.stat().st_mode & 0o7777)
        elif entry.is_file():
            try:
                os.link(entry.path, target)
            except OSError:
                shutil.copy2(entry.path, target)
