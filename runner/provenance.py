"""What a rollout was run with, recorded at INIT as `rollout.meta["run"]` so it can be run again.

    {"harness": "mini-swe-agent", "harness_version": "2.4.6",
     "adapter": {"dialect": "chat", "requirements": [...], "installed_from": "host", ...},
     "task_hash": "sha256:...", "task_path": "/abs/tasks/fix-json", "sandbox": "bwrap",
     "image": null}

`task_hash` is the content of the task as it was run:

- a task directory: SHA-256 over `rolltap.task.v1\\n`, then one line per regular file or
  symlink under it, in byte order of the relative POSIX path:
  `f <mode> <sha256 of the content> <path>\\n` (mode `755` when the owner may execute it, else
  `644`) or `l 777 <sha256 of the link target> <path>\\n`; directories contribute only through
  their entries;
- a JSONL entry: SHA-256 of its canonical JSON (keys sorted, separators `,` and `:`, UTF-8).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from .harnesses.base import BuiltIn, Harness
from .harnesses.install import harness_root, read_record
from .tasks import Task

_TREE_TAG = b"rolltap.task.v1\n"


def task_hash(task: Task) -> str:
    if task.entry_hash is not None:
        return task.entry_hash
    return "sha256:" + tree_hash(task.source)


def tree_hash(root: Path) -> str:
    h = hashlib.sha256(_TREE_TAG)
    entries: list[tuple[bytes, bytes]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*filenames, *(d for d in dirnames if Path(dirpath, d).is_symlink())]:
            path = Path(dirpath, name)
            rel = path.relative_to(root).as_posix().encode()
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                target = hashlib.sha256(os.readlink(path).encode()).hexdigest()
                entries.append((rel, f"l 777 {target} ".encode()))
            elif stat.S_ISREG(info.st_mode):
                mode = "755" if info.st_mode & stat.S_IXUSR else "644"
                entries.append((rel, f"f {mode} {_file_sha256(path)} ".encode()))
    for rel, line in sorted(entries):
        h.update(line + rel + b"\n")
    return h.hexdigest()


def harness_metadata(
    harness: Harness, installed_from: str, settings: dict[str, Any]
) -> dict[str, Any]:
    """The batch-wide part: the harness, the version its install pins, the adapter's settings.

    `installed_from`: host (the `rolltap harness install` prefix, whose manifest is read),
    image (harness_images/NAME on the task image) or builtin."""
    packages = harness.packages
    adapter: dict[str, Any] = {
        "dialect": harness.dialect,
        "installed_from": installed_from,
        "requirements": list(packages.requirements),
        **settings,
    }
    if installed_from == "host":
        record = read_record(harness.name, harness_root())
        if record is not None:
            adapter |= {
                "requirements": record.requirements,
                "interpreter": record.interpreter,
                "installed_at": record.installed_at,
            }
    return {
        "harness": harness.name,
        "harness_version": harness_version(harness, adapter["requirements"]),
        "adapter": adapter,
    }


def harness_version(harness: Harness, requirements: list[str]) -> str | None:
    """The pinned version of the harness itself: its first requirement's pin
    (`mini-swe-agent==2.4.6`, `@openai/codex@0.169.0`); rolltap's own for a built-in one."""
    if isinstance(harness.packages, BuiltIn):
        return str(getattr(harness, "version", None) or "")
    if not requirements:
        return None
    first = requirements[0]
    for separator in ("==", "@"):
        name, found, version = first.rpartition(separator)
        if found and name and version:
            return version
    return None


def run_metadata(
    batch_part: dict[str, Any], task: Task, task_hash_: str, sandbox: str, image: str | None
) -> dict[str, Any]:
    """`rollout.meta["run"]` for one rollout of the batch."""
    return {
        **batch_part,
        "task_hash": task_hash_,
        "task_path": str(task.source),
        "sandbox": sandbox,
        "image": image or task.environment.docker_image,
    }


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
