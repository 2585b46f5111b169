"""The sandbox seam: what the pipeline asks of every sandbox kind, and the data it passes.

Every kind gives a sandbox the same inside layout: the task's workdir, /logs/agent,
/logs/verifier and /logs/artifacts exist and are writable, /tests and /solution can be written
(put) by the runner, HOME is writable, and the only network is `proxy_url`, a loopback HTTP
address piped to the proxy's unix socket. What the agent leaves there stays for the verifier;
what it left running does not (`reap`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..tasks import Task

__all__ = [
    "FORWARDER",
    "INSIDE_FORWARDER",
    "INSIDE_PROXY_DIR",
    "LOG_DIRS",
    "PROXY_PORT",
    "Command",
    "EgressRoute",
    "ExecResult",
    "Limits",
    "Mount",
    "Sandbox",
    "SandboxProvider",
    "SandboxSpec",
]

# Uncommon on purpose: tasks start their own servers on 8000/8080/5000 inside the sandbox.
PROXY_PORT = 43111
EGRESS_PORT = 43112
LOG_DIRS = ("/logs/agent", "/logs/verifier", "/logs/artifacts")
INSIDE_FORWARDER = "/run/rolltap/forwarder.py"
INSIDE_PROXY_DIR = "/run/rolltap/proxy"
"""The proxy socket's directory, mounted read-only."""
FORWARDER = Path(__file__).with_name("forwarder.py")
TIMEOUT_EXIT_CODE = 124
"""exit_code of a command killed at its timeout (coreutils `timeout` uses the same)."""

Command = str | Sequence[str]
"""A shell script (run with `bash -c`) or an argv list."""


def command_argv(cmd: Command) -> list[str]:
    return ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)


@dataclass(frozen=True)
class Mount:
    """A host path visible inside; harness prefixes are mounted read-only at the same path."""

    host_path: Path
    inside_path: str
    read_only: bool = True


@dataclass(frozen=True)
class EgressRoute:
    """The way to the run's egress gate (runner/egress): a unix socket in the proxy socket's
    directory, served inside on 127.0.0.1:port by the same forwarder, each connection opened
    with the rollout's token."""

    socket: Path
    token: str
    port: int = EGRESS_PORT

    @property
    def inside_socket(self) -> str:
        return f"{INSIDE_PROXY_DIR}/{self.socket.name}"


@dataclass(frozen=True)
class Limits:
    """Resource caps; each kind enforces what it can (see its module docstring)."""

    memory_mb: int | None = None
    pids: int | None = None
    cpus: float | None = None


@dataclass(frozen=True)
class SandboxSpec:
    task: Task
    run_id: str
    """Labels everything the sandbox leaves on the host, so `sweep(run_id)` finds it."""
    rollout_id: str
    proxy_socket: Path | None = None
    """The proxy's unix socket on the host; its directory is mounted read-only inside."""
    proxy_port: int = PROXY_PORT
    mounts: tuple[Mount, ...] = ()
    image: str | None = None
    """docker: an image tag (e.g. a harness image built on the task image); bwrap: a rootfs
    directory; apptainer: a SIF file, sandbox directory or docker-daemon: URI. None: the
    kind's default (the task's own image for docker)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Set for every command in the sandbox; exec's own env wins."""
    limits: Limits = field(default_factory=Limits)
    egress: EgressRoute | None = None
    """HTTP(S) out through the egress gate; its socket must sit beside proxy_socket."""

    @property
    def proxy_url(self) -> str | None:
        """The proxy as seen from inside: the forwarder on loopback (None without a socket)."""
        if self.proxy_socket is None:
            return None
        return f"http://127.0.0.1:{self.proxy_port}"


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class Sandbox(Protocol):
    @property
    def proxy_url(self) -> str | None:
        """http://127.0.0.1:PORT as seen from inside; None without a proxy socket."""
        ...

    @property
    def workdir(self) -> str: ...

    @property
    def home(self) -> str:
        """HOME as commands see it (an inside path, like the workdir; `local` maps it to the
        workspace's own directory, never this machine's real home)."""
        ...

    @property
    def environment_built(self) -> bool:
        """True when the root is the task's own image, whose Dockerfile already placed
        environment/files and ran setup.sh; otherwise `provision` does both."""
        ...

    @property
    def agent_user(self) -> str | None:
        """Who the harness runs as (exec's `user`): an unprivileged user where the kind's
        commands otherwise run as the image's root (docker); None where every command runs as
        the one sandbox user (local, bwrap, apptainer)."""
        ...

    async def hand_over(self, user: str | None) -> None:
        """Gives the agent's paths (the workdir, /logs/agent, /logs/artifacts, HOME) to `user`
        before the harness runs, and the workdir back (to the verifier's user; None: root)
        before the tests. Kinds with one sandbox user have nothing to hand over."""
        ...

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
        """Runs cmd (in the workdir by default); at `timeout` seconds kills its whole process
        tree and returns timed_out=True. Output is captured in full and, with `log`, appended
        to that host file as it arrives. `proxy=False`: the command needs no proxy (setup,
        tests), so kinds that start a forwarder per command (bwrap, apptainer) skip it."""
        ...

    async def put(self, host_path: Path, inside_path: str) -> None:
        """Copies a host file to inside_path, or a host directory's contents into it."""
        ...

    async def get(self, inside_path: str, host_path: Path) -> None:
        """Copies an inside file to host_path, or an inside directory's contents into it."""
        ...

    async def reap(self) -> None:
        """Kills every process still running in the sandbox, however it detached (new session,
        double fork, other process group), and keeps the files. After it, nothing the task's
        setup or the agent started can run: the verifier calls it first."""
        ...

    async def fresh_dir(self, inside_path: str, *, user: str | None = None) -> None:
        """Replaces inside_path with a new empty directory owned by `user` (a name or uid; by
        default the sandbox's root), whatever was there: files, or a link planted in its place.
        Kinds that run every command as one user own it by that user."""
        ...

    async def close(self) -> None:
        """Kills everything in the sandbox and removes it; safe to call twice."""
        ...


class SandboxProvider(Protocol):
    kind: str

    async def create(self, spec: SandboxSpec) -> Sandbox:
        """A started sandbox with the standard layout; raises SandboxStartError (retryable),
        ImageBuildError or SandboxUnavailable."""
        ...

    async def sweep(self, run_id: str) -> int:
        """Removes whatever sandboxes of run_id left behind (after a crash); returns how many."""
        ...

    async def close(self) -> None:
        """Closes every sandbox this provider still holds and releases its clients."""
        ...
