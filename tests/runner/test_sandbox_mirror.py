"""Mirrors of directories the sandbox user cannot look up: the same files (hard links, modes
kept), built once per install, replaced after a reinstall, and old ones collected."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from rolltap.runner.sandboxes.identity import SandboxUser
from rolltap.runner.sandboxes.mirror import STALE_AFTER_SEC, mirror


def _install(source: Path) -> None:
    (source / "bin").mkdir(parents=True)
    (source / "bin" / "tool").write_text("#!/bin/sh\n")
    (source / "bin" / "tool").chmod(0o750)
    (source / "lib").symlink_to("bin")


def test_a_mirror_is_the_same_tree_of_the_same_files(tmp_path: Path) -> None:
    source = tmp_path / "install"
    _install(source)

    found = mirror(source, tmp_path / "mirrors")

    assert found.parent == tmp_path / "mirrors"
    tool, original = found / "bin" / "tool", source / "bin" / "tool"
    assert tool.stat().st_ino == original.stat().st_ino  # a link, not a copy
    assert oct(tool.stat().st_mode & 0o777) == "0o750"
    assert os.readlink(found / "lib") == "bin"
    assert mirror(source, tmp_path / "mirrors") == found  # built once


def test_a_reinstall_gets_a_new_mirror_and_old_ones_are_collected(tmp_path: Path) -> None:
    source, mirrors = tmp_path / "install", tmp_path / "mirrors"
    _install(source)
    first = mirror(source, mirrors)
    for path in sorted(source.rglob("*"), reverse=True):
        path.unlink() if path.is_file() or path.is_symlink() else path.rmdir()
    source.rmdir()
    _install(source)

    second = mirror(source, mirrors)
    young_kept = first.exists()
    aged = time.time() - STALE_AFTER_SEC - 60
    os.utime(first, (aged, aged))
    other = tmp_path / "other"
    _install(other)
    mirror(other, mirrors)  # any later mirror collects what is stale

    assert second != first
    assert young_kept  # a batch still running may have it mounted
    assert not first.exists()
    assert second.exists()


def test_the_sandbox_user_reaches_a_path_through_searchable_directories_only() -> None:
    user = SandboxUser(61999, 61999)
    top = Path(tempfile.mkdtemp(dir="/tmp"))  # /tmp is searchable by everyone
    try:
        (top / "sub").mkdir()
        top.chmod(0o700)
        locked = user.can_reach(top / "sub" / "file")
        top.chmod(0o711)
        opened = user.can_reach(top / "sub" / "file")
        top.chmod(0o710)
        by_others = user.can_reach(top / "sub" / "file")
        os.chown(top, -1, os.getgid())
        group_of_mine = SandboxUser(61999, os.getgid()).can_reach(top / "sub" / "file")
    finally:
        shutil.rmtree(top)

    assert (locked, opened, by_others) == (False, True, False)
    assert group_of_mine  # 0710: searchable by the directory's group
