"""The `bwrap` kind: every command runs in a fresh bubblewrap sandbox over the rollout's workspace.

- Who: bubblewrap runs as the sandbox user (identity.py): a dedicated unprivileged uid when the
  runner is root, else the runner's own; never as root. In its new user namespace that user is
  uid 0, but with every capability dropped (`--cap-drop ALL`) and no way to make another user
  namespace (`--disable-userns`): root-looking, owning nothing of the host, able to mount
  nothing. Host files it does not own appear as nobody's. exec(user=...) is ignored.
- Namespaces: all of them (user, PID, mount, network, IPC, UTS, cgroup), a new session, and
  `--die-with-parent`; no setuid helper, no daemon.
- Root: read-only. By default the host's /usr (and the /bin, /lib... links) and an /etc made for
  the sandbox (etc.py); never the host's /etc, /var, /opt, /srv, /home or /root, the store or
  the proxy's secret. With a rootfs directory (provider `rootfs=`, or spec.image) its top-level
  entries instead; the rootfs's workdir contents seed the workspace.
- Writable: the workdir, /logs, /tests, /solution, /tmp, /var/tmp and HOME=/root, bound from the
  workspace (owned by the sandbox user), so the verifier's command sees what the agent's left.
- Mounts (harness installs): read-only at their own paths. One the sandbox user cannot look up
  (a root runner's harness under /root) is mounted from a mirror of hard links (mirror.py).
- Network: loopback only. With a proxy socket, its directory is mounted read-only at
  /run/rolltap/proxy and forwarder.py, run in front of every command, serves it on
  127.0.0.1:PORT (python3 must be in the root).
- Processes: each command lives in its own PID namespace; killing bwrap (at the timeout, or when
  the runner dies) kills everything in it, and nothing a command started outlives it, so
  `reap` has nothing left to do.
- Limits: not enforced: without cgroup delegation there is nothing to enforce them with; the
  runner's timeouts still apply.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

from .base import INSIDE_FORWARDER, INSIDE_PROXY_DIR, SandboxSpec
from .errors import ImageBuildError, SandboxStartError, SandboxUnavailable
from .identity import SandboxUser, sandbox_user
from .mirror import MountSources
from .workspace import Workspace, create_workspace, hand_over, remove_workspace, sweep_workspaces
from .wrapped import Wrap, WrappedSandbox, check_mounts, support_dir

HOST_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
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
        user: SandboxUser | None = None,
    ) -> None:
        """root: where workspaces live; rootfs: a root directory instead of the host's; user:
        who the sandboxes run as (default: identity.sandbox_user())."""
        found = shutil.which(bwrap)
        if found is None:
            raise SandboxUnavailable(f"{bwrap} not found: install bubblewrap (.ci/setup-bwrap)")
        self._bwrap = found
        self._root = root or Path(tempfile.gettempdir()) / "rolltap-bwrap"
        self._rootfs = rootfs
        self._keep = keep
        self.user = user or sandbox_user()
        self._live: set[WrappedSandbox] = set()
        self._sources = MountSources(self.user)
        self._support = support_dir(etc=rootfs is None)

    async def create(self, spec: SandboxSpec) -> WrappedSandbox:
        rootfs = Path(spec.image) if spec.image else self._rootfs
        if rootfs is not None and not (rootfs / "usr").is_dir():
            raise ImageBuildError(f"rootfs {rootfs} is missing or has no /usr")
        check_mounts(spec)
        if spec.proxy_socket is not None and not spec.proxy_socket.parent.is_dir():
            raise SandboxStartError(f"proxy socket directory {spec.proxy_socket.parent} is missing")
        sources = await self._sources.resolve(spec.mounts)
        try:
            ws = await asyncio.to_thread(self._workspace, spec, rootfs)
        except OSError as e:
            raise SandboxStartError(f"cannot create the workspace: {e}") from e
        args = _sandbox_args(spec, ws, rootfs, self._support, sources)
        sandbox = WrappedSandbox(
            spec,
            ws,
            _wrapper([self._bwrap, *args]),
            keep=self._keep,
            on_close=self._live.discard,
            user=self.user,
        )
        self._live.add(sandbox)
        return sandbox

    async def sweep(self, run_id: str) -> int:
        return await asyncio.to_thread(sweep_workspaces, self._root, run_id)

    async def close(self) -> None:
        for sandbox in list(self._live):
            await sandbox.close()
        shutil.rmtree(self._support, ignore_errors=True)

    def _workspace(self, spec: SandboxSpec, rootfs: Path | None) -> Workspace:
        owner = self.user if self.user.switches else None
        ws = create_workspace(self._root, spec.run_id, spec.rollout_id, spec.task.workdir, owner)
        if not self.user.can_reach(ws.fs):
            remove_workspace(ws)
            raise SandboxStartError(
                f"workspaces under {self._root} are out of reach of the sandbox user"
                f" (uid {self.user.uid}): choose a root whose directories it can search"
            )
        seed = rootfs / spec.task.workdir.lstrip("/") if rootfs else None
        if seed is not None and seed.is_dir():
            workdir = ws.host_path(spec.task.workdir)
            shutil.copytree(seed, workdir, symlinks=True, dirs_exist_ok=True)
            hand_over(ws, workdir)
        return ws


def _wrapper(prefix: list[str]) -> Wrap:
    def wrap(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        # bwrap hands its own environment to the command: the caller builds it from scratch.
        return [*prefix, "--chdir", cwd, "--", *argv], env

    return wrap


def _sandbox_args(
    spec: SandboxSpec,
    ws: Workspace,
    rootfs: Path | None,
    support: Path,
    sources: dict[Path, Path],
) -> list[str]:
    args = [
        *("--unshare-all", "--unshare-user", "--disable-userns"),
        *("--die-with-parent", "--new-session", "--cap-drop", "ALL"),
        *("--uid", "0", "--gid", "0", "--hostname", "sandbox"),
        *("--dev", "/dev", "--proc", "/proc", "--tmpfs", "/run"),
        *_root_args(rootfs, support),
    ]
    for inside in ws.roots:
        args += ["--bind", str(ws.host_path(inside)), inside]
    if spec.proxy_socket is not None:
        args += ["--ro-bind", str(support / "forwarder.py"), INSIDE_FORWARDER]
        args += ["--ro-bind", str(spec.proxy_socket.parent), INSIDE_PROXY_DIR]
    for m in spec.mounts:
        args += ["--ro-bind" if m.read_only else "--bind", str(sources[m.host_path]), m.inside_path]
    return args


def _root_args(rootfs: Path | None, support: Path) -> list[str]:
    names: tuple[str, ...]
    if rootfs is None:
        root, names = Path("/"), HOST_SYSTEM_DIRS
        args = ["--ro-bind", str(support / "etc"), "/etc"]
    else:
        root, names = rootfs, tuple(sorted(os.listdir(rootfs)))
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
