"""Copies into and out of a docker container as tar archives (blocking, for a pool thread)."""

from __future__ import annotations

import io
import os
import posixpath
import shutil
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import IO

import docker
import docker.errors

from .errors import SandboxCopyError


def put_bytes(api: docker.APIClient, container_id: str, data: bytes, inside: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(inside.lstrip("/"))
        info.size, info.mode = len(data), 0o600
        tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    _put_archive(api, container_id, buf)


def put_dir_entry(
    api: docker.APIClient, container_id: str, inside: str, uid: int, gid: int
) -> None:
    """Sets an existing directory's owner (and mode 0755): the daemon applies the archive's."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(inside.lstrip("/"))
        info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, uid, gid
        tar.addfile(info)
    buf.seek(0)
    _put_archive(api, container_id, buf)


def chown_trees(
    api: docker.APIClient, container_id: str, paths: list[str], uid: int, gid: int
) -> list[str]:
    """Gives directory trees to uid:gid (root in the container has no CAP_CHOWN): the daemon
    extracts a copy of them whose every member has that owner, setuid and setgid bits dropped,
    from one archive (each extraction costs the daemon a process). Returns the paths that do
    not exist, left out."""
    missing = []
    with tempfile.TemporaryFile() as out:
        with tarfile.open(fileobj=out, mode="w") as owned:
            for inside in paths:
                try:
                    stream, _ = api.get_archive(container_id, inside)
                except docker.errors.NotFound:
                    missing.append(inside)
                    continue
                _add_owned(
                    stream, posixpath.dirname(inside.rstrip("/")).lstrip("/"), owned, uid, gid
                )
        if len(missing) < len(paths):
            out.seek(0)
            _put_archive(api, container_id, out)
    return missing


def _add_owned(
    stream: Iterable[bytes], parent: str, owned: tarfile.TarFile, uid: int, gid: int
) -> None:
    with tempfile.TemporaryFile() as got:
        for chunk in stream:
            got.write(chunk)
        got.seek(0)
        with tarfile.open(fileobj=got) as tar:
            for member in tar:
                member.name = posixpath.join(parent, member.name)
                if member.islnk():
                    member.linkname = posixpath.join(parent, member.linkname)
                member.uid, member.gid, member.uname, member.gname = uid, gid, "", ""
                member.mode &= ~0o6000
                owned.addfile(member, tar.extractfile(member) if member.isreg() else None)


def put_path(api: docker.APIClient, container_id: str, host_path: Path, inside: str) -> None:
    """A host file to `inside`, or a host directory's contents into it."""
    if not host_path.exists():
        raise SandboxCopyError(f"{host_path} does not exist")
    with tempfile.TemporaryFile() as buf:
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(host_path, arcname=inside.lstrip("/") or ".", filter=_as_root)
        buf.seek(0)
        _put_archive(api, container_id, buf)


def get_path(api: docker.APIClient, container_id: str, inside: str, host_path: Path) -> None:
    """An inside file to host_path, or an inside directory's contents into it."""
    if inside == "/":
        raise SandboxCopyError("copying the whole root out is not supported")
    try:
        stream, _ = api.get_archive(container_id, inside)
    except docker.errors.NotFound as e:
        raise SandboxCopyError(f"{inside} does not exist in the sandbox") from e
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "archive.tar"
        with open(archive, "wb") as f:
            for chunk in stream:
                f.write(chunk)
        out = Path(tmp) / "out"
        with tarfile.open(archive) as tar:
            tar.extractall(out, filter=_safe_member)
        src = out / PurePosixPath(inside).name
        host_path.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, host_path, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(src, host_path, follow_symlinks=False)


def _put_archive(api: docker.APIClient, container_id: str, data: IO[bytes]) -> None:
    # Extracted at the root, so every archive member names its full inside path; the daemon
    # creates missing parents and never follows the container's symlinks out of it.
    if not api.put_archive(container_id, "/", data):
        raise SandboxCopyError("the daemon refused the archive")


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _safe_member(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    # Regular files, directories and links only (no device nodes from a container), each kept
    # inside dest by the standard "tar" filter; owned by whoever runs the runner.
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        return None
    safe = tarfile.tar_filter(member, dest)
    return safe.replace(uid=os.getuid(), gid=os.getgid(), uname="", gname="", deep=False)
