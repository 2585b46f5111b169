"""The `local` kind, for development: commands run on the host, in a per-rollout temp workspace,
with no isolation at all (host network, host processes, host files).

Task paths are absolute (/app, /tests, /logs/verifier, /solution). Mapping them with a mount
namespace would need a new root (bwrap's job), so this kind rewrites them instead: every
occurrence of the workdir, /logs, /tests, /solution and HOME (/root) in commands, working
directories, environment values, and text files copied under /tests or /solution becomes the
matching workspace directory: HOME is the workspace's own. Paths the agent composes at run
time are not rewritten: an agent that writes to /app itself writes to the host's /app. Use bwrap
for real runs.

Processes: every command runs under reaper.py, a child subreaper, so whatever it leaves running
(double forks, setsid daemons, other process groups included) is killed when it exits, and its
whole tree at the timeout; `reap` has nothing left to do. The command runs as the runner's user
and could kill its reaper first: nothing here holds against a hostile agent.

Network: the host's, unisolated. The proxy is served on a loopback port of the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from .base import Command, ExecResult, Mount, SandboxSpec, command_argv
from .errors import SandboxExecError
from .forwarder import BACKLOG, serve
from .process import run_process
from .workspace import (
    HOME,
    Workspace,
    copy_in,
    copy_out,
    create_workspace,
    fresh_dir,
    locate,
    normalize,
    remove_workspace,
    sweep_workspaces,
)

_REWRITTEN_COPIES = ("/tests", "/solution")
REAPER = Path(__file__).with_name("reaper.py")


class PathMap:
    """Rewrites the task's absolute inside paths to their workspace directories."""

    def __init__(self, ws: Workspace, workdir: str, mounts: tuple[Mount, ...]) -> None:
        inside = (workdir, "/logs", HOME, *_REWRITTEN_COPIES)
        self._map = {p: str(ws.host_path(p)) for p in inside}
        self._map.update({m.inside_path: str(m.host_path) for m in mounts})
        alternatives = "|".join(re.escape(p) for p in sorted(self._map, key=len, reverse=True))
        self._pattern = re.compile(rf"(?<![\w./-])({alternatives})(?=/|[^\w.-]|$)")

    def text(self, text: str) -> str:
        return self._pattern.sub(lambda m: self._map[m.group(1)], text)

    def path(self, inside: str) -> Path:
        return Path(self.text(normalize(inside)))


class LocalSandbox:
    def __init__(
        self,
        spec: SandboxSpec,
        ws: Workspace,
        forwarder: asyncio.Task[None] | None,
        port: int | None,
        keep: bool,
        on_close: Callable[[LocalSandbox], None],
    ) -> None:
        self._spec = spec
        self._ws = ws
        self._paths = PathMap(ws, spec.task.workdir, spec.mounts)
        self._forwarder = forwarder
        self._port = port
        self._keep = keep
        self._on_close = on_close
        self._closed = False

    @property
    def proxy_url(self) -> str | None:
        return f"http://127.0.0.1:{self._port}" if self._port is not None else None

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
        full_env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(self._ws.host_path(HOME)),
            **self._spec.env,
            **(env or {}),
        }
        return await run_process(
            [sys.executable, "-I", "-S", str(REAPER), "--", *(self._paths.text(a) for a in argv)],
            env={k: self._paths.text(v) for k, v in full_env.items()},
            cwd=self._paths.path(cwd or self.workdir),
            stdin=stdin,
            timeout=timeout,
            log=log,
            kill_leftovers=True,
        )

    async def put(self, host_path: Path, inside_path: str) -> None:
        dest, fence = locate(self._ws, self._spec.mounts, inside_path, writing=True)
        await asyncio.to_thread(copy_in, host_path, dest, fence)
        if any(normalize(inside_path).startswith(p) for p in _REWRITTEN_COPIES):
            await asyncio.to_thread(self._rewrite_files, dest)

    async def get(self, inside_path: str, host_path: Path) -> None:
        src, fence = locate(self._ws, self._spec.mounts, inside_path, writing=False)
        await asyncio.to_thread(copy_out, src, host_path, fence)

    @property
    def agent_user(self) -> str | None:
        return None  # everything runs as the runner's user

    async def hand_over(self, user: str | None) -> None:
        """Nothing to hand over: every command runs as the runner's user."""

    async def reap(self) -> None:
        """Nothing to kill: each command's reaper killed what it left (module docstring)."""

    async def fresh_dir(self, inside_path: str, *, user: str | None = None) -> None:
        if self._closed:
            raise SandboxExecError("the sandbox is closed")
        await asyncio.to_thread(fresh_dir, self._ws, inside_path)

    async def close(self) -> None:
        self._closed = True
        self._on_close(self)
        if self._forwarder is not None:
            self._forwarder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._forwarder
            self._forwarder = None
        if not self._keep:
            await asyncio.to_thread(remove_workspace, self._ws)

    def _rewrite_files(self, dest: Path) -> None:
        files = [dest] if dest.is_file() else [p for p in dest.rglob("*") if p.is_file()]
        for f in files:
            if f.is_symlink():
                continue
            try:
                text = f.read_text()
            except UnicodeDecodeError:
                continue
            if (new := self._paths.text(text)) != text:
                f.write_text(new)


class LocalProvider:
    kind = "local"

    def __init__(self, root: Path | None = None, *, keep: bool = False) -> None:
        self._root = root or Path(tempfile.gettempdir()) / "rolltap-local"
        self._keep = keep
        self._live: set[LocalSandbox] = set()

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        ws = await asyncio.to_thread(
            create_workspace, self._root, spec.run_id, spec.rollout_id, spec.task.workdir
        )
        forwarder, port = None, None
        if spec.proxy_socket is not None:
            sock = socket.create_server(("127.0.0.1", 0), backlog=BACKLOG)
            port = sock.getsockname()[1]
            forwarder = asyncio.ensure_future(serve(sock, str(spec.proxy_socket)))
        sandbox = LocalSandbox(spec, ws, forwarder, port, self._keep, self._live.discard)
        self._live.add(sandbox)
        return sandbox

    async def sweep(self, run_id: str) -> int:
        return await asyncio.to_thread(sweep_workspaces, self._root, run_id)

    async def close(self) -> None:
        for sandbox in list(self._live):
            await sandbox.close()
