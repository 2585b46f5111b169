"""The `bwrap` kind: every command runs in a fresh bubblewrap sandbox over the rollout's workspace.

- Namespaces: `--unshare-all` (user, PID, mount, network, IPC, UTS) and `--die-with-parent`; no
  setuid, no daemon. Everything runs as uid 0 of a user namespace, so files it writes on the
  host belong to the runner's user; exec(user=...) is ignored.
- Root: read-only. By default the host's system directories (/usr, /etc, /opt, /var, /srv and
  the /bin, /lib... links); the rest of the host (home directories, /root, /tmp, /run, /work...)
  is absent. With a rootfs directory (provider `rootfs=`, or spec.image) its top-level entries
  instead; the rootfs's workdir contents seed the workspace.
- Writable: the workdir, /logs, /tests, /solution, /tmp, /var/tmp and HOME=/root, bound from the
  workspace, so the verifier's command sees what the agent's command left.
- Network: loopback only. With a proxy socket, its directory is mounted read-only at
  /run/rolltap/proxy and forwarder.py, run in front of every command, serves it on
  127.0.0.1:PORT (python3 must be in the root).
- Processes: each command lives in its own PID namespace; killing bwrap (at the timeout, or when
  the runner dies) kills everything in it, and nothing a command started outlives it.
- Limits: not enforced: without cgroup delegation there is nothing to enforce them with; the
  runner's timeouts still apply.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

from rolltap.runner.sandboxes.base import (
    FORWARDER,
    INSIDE_FORWARDER,
    INSIDE_PROXY_DIR,
    SandboxSpec,
)
from rolltap.runner.sandboxes.errors import (
    ImageBuildError,
    SandboxStartError,
    SandboxUnavailable,
)
from rolltap.runner.sandboxes.workspace import Workspace, create_workspace, sweep_workspaces
from rolltap.runner.sandboxes.wrapped import Wrap, WrappedSandbox, check_mounts

HOST_SYSTEM_DIRS = ("usr", "etc", "opt", "var", "srv", "bin", "sbin", "lib", "lib32", "lib64")
# Provided fresh (or from the workspace) instead of taken from a rootfs.
_NOT_FROM_ROOTFS = {"proc", "dev", "sys", "tmp", "run", "root", "lost+found"}


class BwrapProvider:
    kind = "bwrap"

    def __init__(
        self,
        root: Path | None = None,
        *,
        rootfs: Path | None = None,
        bwrap: str = "bwrap",
        keep: bool = False,
    ) -> None:
        """root: where workspaces live; rootfs: a root directory instead of the host's."""
        found = shutil.which(bwrap)
        if found is None:
            raise SandboxUnavailable(f"{bwrap} not found: install bubblewrap (.ci/setup-bwrap)")
        self._bwrap = found
        self._root = root or Path(tempfile.gettempdir()) / "rolltap-bwrap"
        self._rootfs = rootfs
        self._keep = keep
        self._live: set[WrappedSandbox] = set()

    async def create(self, spec: SandboxSpec) -> WrappedSandbox:
        rootfs = Path(spec.image) if spec.image else self._rootfs
        if rootfs is not None and not (rootfs / "usr").is_dir():
            raise ImageBuildError(f"rootfs {rootfs} is missing or has no /usr")
        check_mounts(spec)
        if spec.proxy_socket is not None and not spec.proxy_socket.parent.is_dir():
            raise SandboxStartError(f"proxy socket directory {spec.proxy_socket.parent} is missing")
        try:
            ws = await asyncio.to_thread(self._workspace, spec, rootfs)
        except OSError as e:
            raise SandboxStartError(f"cannot create the workspace: {e}") from e
        wrap = _wrapper([self._bwrap, *_sandbox_args(spec, ws, rootfs)])
        sandbox = WrappedSandbox(spec, ws, wrap, keep=self._keep, on_close=self._live.discard)
        self._live.add(sandbox)
        return sandbox

    async def sweep(self, run_id: str) -> int:
        return await asyncio.to_thread(sweep_workspaces, self._root, run_id)

    async def close(self) -> None:
        for sandbox in list(self._live):
            await sandbox.close()

    def _workspace(self, spec: SandboxSpec, rootfs: Path | None) -> Workspace:
        ws = create_workspace(self._root, spec.run_id, spec.rollout_id, spec.task.workdir)
        seed = rootfs / spec.task.workdir.lstrip("/") if rootfs else None
        if seed is not None and seed.is_dir():
            shutil.copytree(
                seed, ws.host_path(spec.task.workdir), symlinks=True, dirs_exist_ok=True
            )
        return ws


def _wrapper(prefix: list[str]) -> Wrap:
    def wrap(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        # bwrap hands its own environment to the command: the caller builds it from scratch.
        return [*prefix, "--chdir", cwd, "--", *argv], env

    return wrap


def _sandbox_args(spec: SandboxSpec, ws: Workspace, rootfs: Path | None) -> list[str]:
    args = [
        *("--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"),
        *("--uid", "0", "--gid", "0", "--hostname", "sandbox"),
        *("--dev", "/dev", "--proc", "/proc", "--tmpfs", "/run"),
        *_root_args(rootfs),
    ]
    for inside in ws.roots:
        args += ["--bind", str(ws.host_path(inside)), inside]
    if spec.proxy_socket is not None:
        args += ["--ro-bind", str(FORWARDER), INSIDE_FORWARDER]
        args += ["--ro-bind", str(spec.proxy_socket.parent), INSIDE_PROXY_DIR]
    for m in spec.mounts:
        args += ["--ro-bind" if m.read_only else "--bind", str(m.host_path), m.inside_path]
    return args


def _root_args(rootfs: Path | None) -> list[str]:
    root = rootfs or Path("/")
    names = HOST_SYSTEM_DIRS if rootfs is None else sorted(os.listdir(root))
    args = []
    for name in names:
        path = root / name
        if name in _NOT_FROM_ROOTFS:
            continue
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.exists():
            args += ["--ro-bind", str(path), f"/{name}"]
    return args
