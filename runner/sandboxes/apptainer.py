"""The `apptainer` kind, for rootless HPC hosts: every command is one `apptainer exec` over the
rollout's workspace, like the bwrap kind.

- Image: spec.image or the provider's image: a SIF file, a sandbox directory, or a URI apptainer
  converts (docker-daemon:rolltap-task/x:hash for a task image built by the docker kind; build a
  SIF once with `apptainer build` rather than converting per command). Workdir contents of the
  image are hidden by the workspace, so tasks must follow the portable rule (files/ + setup.sh,
  examples/tasks/README.md).
- Who: apptainer runs as the sandbox user (identity.py), never as root: a root runner starts it
  as the dedicated unprivileged uid (apptainer's user-namespace mode), which owns the workspace,
  and `--no-privs` drops every capability. Mount sources that user cannot look up are mirrored
  (mirror.py), as in the bwrap kind.
- Isolation: `--containall` (fresh /dev, PID and IPC namespaces, clean environment),
  `--net --network none` (loopback only; unprivileged use needs Apptainer >= 1.1 in its default
  user-namespace mode), `--no-mount home,cwd`. Writable: the workspace paths and HOME=/root
  bound from the workspace; the proxy as in the bwrap kind (python3 must be in the image).
- Processes and limits as in the bwrap kind: the command's PID namespace dies with it, so
  `reap` has nothing to kill; limits are not enforced.

Built and documented, but not exercised here: apptainer is not in Debian bookworm main.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from .base import INSIDE_FORWARDER, INSIDE_PROXY_DIR, SandboxSpec
from .errors import ImageBuildError, SandboxStartError, SandboxUnavailable
from .identity import SandboxUser, sandbox_user
from .mirror import MountSources
from .workspace import HOME, Workspace, create_workspace, sweep_workspaces
from .wrapped import Wrap, WrappedSandbox, check_mounts, support_dir


class ApptainerProvider:
    kind = "apptainer"

    def __init__(
        self,
        root: Path | None = None,
        *,
        image: str | None = None,
        apptainer: str = "apptainer",
        keep: bool = False,
        user: SandboxUser | None = None,
    ) -> None:
        found = shutil.which(apptainer)
        if found is None:
            raise SandboxUnavailable(
                f"{apptainer} not found (it is not in Debian bookworm main; see apptainer.org)"
            )
        self._apptainer = found
        self._root = root or Path(tempfile.gettempdir()) / "rolltap-apptainer"
        self._image = image
        self._keep = keep
        self.user = user or sandbox_user()
        self._live: set[WrappedSandbox] = set()
        self._sources = MountSources(self.user)
        self._support = support_dir(etc=False)

    async def create(self, spec: SandboxSpec) -> WrappedSandbox:
        image = spec.image or self._image
        if image is None:
            raise ImageBuildError("the apptainer kind needs an image (SIF, sandbox dir or URI)")
        if ":" not in image and not Path(image).exists():
            raise ImageBuildError(f"image {image} does not exist")
        check_mounts(spec)
        sources = await self._sources.resolve(spec.mounts)
        owner = self.user if self.user.switches else None
        try:
            ws = await asyncio.to_thread(
                create_workspace, self._root, spec.run_id, spec.rollout_id, spec.task.workdir, owner
            )
        except OSError as e:
            raise SandboxStartError(f"cannot create the workspace: {e}") from e
        wrap = _wrapper(self._apptainer, _bind_args(spec, ws, self._support, sources), image)
        sandbox = WrappedSandbox(
            spec, ws, wrap, keep=self._keep, on_close=self._live.discard, user=self.user
        )
        self._live.add(sandbox)
        return sandbox

    async def sweep(self, run_id: str) -> int:
        return await asyncio.to_thread(sweep_workspaces, self._root, run_id)

    async def close(self) -> None:
        for sandbox in list(self._live):
            await sandbox.close()
        shutil.rmtree(self._support, ignore_errors=True)


def _wrapper(apptainer: str, binds: list[str], image: str) -> Wrap:
    def wrap(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        flags = ["--containall", "--no-privs", "--net", "--network", "none"]
        flags += ["--no-mount", "home,cwd"]
        flags += ["--pwd", cwd, *binds]
        # --cleanenv drops the caller's environment; APPTAINERENV_X becomes X inside (HOME is
        # apptainer's own, set by --home).
        host_env = {f"APPTAINERENV_{k}": v for k, v in env.items() if k != "HOME"}
        host_env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
        return [apptainer, "exec", *flags, image, *argv], host_env

    return wrap


def _bind_args(
    spec: SandboxSpec, ws: Workspace, support: Path, sources: dict[Path, Path]
) -> list[str]:
    binds = [f"{ws.host_path(inside)}:{inside}" for inside in ws.roots if inside != HOME]
    args = ["--home", f"{ws.host_path(HOME)}:{HOME}"]
    if spec.proxy_socket is not None:
        binds.append(f"{support / 'forwarder.py'}:{INSIDE_FORWARDER}:ro")
        binds.append(f"{spec.proxy_socket.parent}:{INSIDE_PROXY_DIR}:ro")
    for m in spec.mounts:
        binds.append(f"{sources[m.host_path]}:{m.inside_path}:{'ro' if m.read_only else 'rw'}")
    for b in binds:
        args += ["--bind", b]
    return args
