"""A sandbox whose every command is one host process wrapping it in fresh namespaces (bwrap,
apptainer) over a persistent host workspace, with the proxy forwarder in front of the command.

A command's PID namespace dies with it, and every process in it: between commands nothing of the
sandbox runs, so `reap` has nothing to do and copies never race a process of the agent."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from .base import (
    FORWARDER,
    INSIDE_FORWARDER,
    INSIDE_PROXY_DIR,
    Command,
    ExecResult,
    SandboxSpec,
    command_argv,
)
from .errors import SandboxExecError, SandboxStartError
from .etc import build_etc
from .identity import SandboxUser
from .process import run_process
from .workspace import HOME, Workspace, copy_in, copy_out, fresh_dir, locate, remove_workspace

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def support_dir(*, etc: bool) -> Path:
    """A new directory, readable by the sandbox user, with what every sandbox of a provider
    mounts: forwarder.py (the package itself may live under /root) and, with `etc`, the /etc
    made for sandboxes over the host's /usr. The provider removes it when it closes."""
    support = Path(tempfile.mkdtemp(prefix="rolltap-sandbox-"))
    support.chmod(0o755)
    if etc:
        build_etc(support / "etc")
    shutil.copy(FORWARDER, support / "forwarder.py")
    (support / "forwarder.py").chmod(0o644)
    return support


def check_mounts(spec: SandboxSpec) -> None:
    """Refuse a missing bind source at start, not as an obscure failure of the first command."""
    for m in spec.mounts:
        if not m.host_path.exists():
            raise SandboxStartError(f"mount source {m.host_path} does not exist")


Wrap = Callable[[list[str], str, dict[str, str]], tuple[list[str], dict[str, str]]]
"""(argv inside, cwd inside, env inside) -> (host argv, host env)."""


class WrappedSandbox:
    def __init__(
        self,
        spec: SandboxSpec,
        ws: Workspace,
        wrap: Wrap,
        *,
        keep: bool,
        on_close: Callable[[WrappedSandbox], None],
        user: SandboxUser | None = None,
    ) -> None:
        """user: start every command's wrapper as this user."""
        self._spec = spec
        self._ws = ws
        self._wrap = wrap
        self._keep = keep
        self._on_close = on_close
        self._user = user
        self._closed = False

    @property
    def proxy_url(self) -> str | None:
        return self._spec.proxy_url

    @property
    def workdir(self) -> str:
        return self._spec.task.workdir

    @property
    def home(self) -> str:
        return HOME

    @property
    def environment_built(self) -> bool:
        return False

    @property
    def workspace(self) -> Path:
        return self._ws.dir

    @property
    def agent_user(self) -> str | None:
        return None  # every command runs as the sandbox user (identity.py)

    async def hand_over(self, user: str | None) -> None:
        """Nothing to hand over: the workspace is the sandbox user's, who runs every command."""

    async def exec(
        self,
        cmd: Command,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        user: str | None = None,
        log: Path | None = None,
        proxy: bool = True,
    ) -> ExecResult:
        if self._closed:
            raise SandboxExecError("the sandbox is closed")
        argv = command_argv(cmd)
        inside_env = {
            "PATH": PATH,
            "HOME": HOME,
            "LANG": "C.UTF-8",
            **self._spec.env,
            **(env or {}),
        }
        forwarder = forwarder_argv(self._spec) if proxy else []
        host_argv, host_env = self._wrap(forwarder + argv, cwd or self.workdir, inside_env)
        return await run_process(
            host_argv, env=host_env, stdin=stdin, timeout=timeout, log=log, user=self._user
        )

    async def put(self, host_path: Path, inside_path: str) -> None:
        dest, fence = locate(self._ws, self._spec.mounts, inside_path, writing=True)
        owner = self._ws.owner if fence == self._ws.fs else None  # never re-own a host mount
        await asyncio.to_thread(copy_in, host_path, dest, fence, owner)

    async def get(self, inside_path: str, host_path: Path) -> None:
        src, fence = locate(self._ws, self._spec.mounts, inside_path, writing=False)
        await asyncio.to_thread(copy_out, src, host_path, fence)

    async def reap(self) -> None:
        """Nothing to kill: each command's PID namespace ended with it (module docstring)."""

    async def fresh_dir(self, inside_path: str, *, user: str | None = None) -> None:
        if self._closed:
            raise SandboxExecError("the sandbox is closed")
        await asyncio.to_thread(fresh_dir, self._ws, inside_path)

    async def close(self) -> None:
        self._closed = True
        self._on_close(self)
        if not self._keep:
            await asyncio.to_thread(remove_workspace, self._ws)


def forwarder_argv(spec: SandboxSpec) -> list[str]:
    """The inside argv prefix that serves the proxy on loopback for one command."""
    if spec.proxy_socket is None:
        return []
    listen = f"127.0.0.1:{spec.proxy_port}"
    unix = f"{INSIDE_PROXY_DIR}/{spec.proxy_socket.name}"
    argv = ["python3", "-I", "-S", INSIDE_FORWARDER, "--listen", listen, "--unix", unix]
    return [*argv, *egress_args(spec), "--"]


def egress_args(spec: SandboxSpec) -> list[str]:
    """The forwarder's options for the egress route (none without one)."""
    route = spec.egress
    if route is None:
        return []
    if spec.proxy_socket is None or route.socket.parent != spec.proxy_socket.parent:
        raise SandboxStartError("the egress socket must sit beside the proxy socket")
    return [
        *("--egress", f"127.0.0.1:{route.port}", "--egress-unix", route.inside_socket),
        *("--egress-token", route.token),
    ]
