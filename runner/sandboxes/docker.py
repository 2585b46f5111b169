"""The `docker` kind: one labeled container per rollout on a local daemon, driven by docker-py.

- Image: spec.image (e.g. a harness image built FROM `task_image(task)`), else the task's own
  image (task.toml docker_image, or environment/Dockerfile built locally and cached by content
  hash), else the base image. Nothing is pulled unless a named image is missing.
- Container: `network_mode="none"`, labels rolltap.run, rolltap.rollout and rolltap.task,
  docker-init as PID 1 (reaps orphans); its main process is `sleep <ttl>`, so a runner killed
  with -9 cannot leave it running for ever, and `sweep(run_id)` removes what a crash left.
  Not auto-removed: docker 20.10 (Debian 12's) restores AutoRemove at the end of a restart
  while its exit monitor may not yet have read it, and then deletes the container mid-restart
  (seen under load as "the container ended while starting" at `reap`). A container whose
  runner was killed stops at its TTL and stays, stopped, until a sweep or `docker container
  prune`. The main process runs as root; commands run as exec(user=...) or
  the image's USER.
- The agent: the harness runs unprivileged (`agent_user`): as the task's `[agent] user`, else the
  image's own non-root USER, else rolltap's agent user (uid and gid 61000, `rolltap`, HOME
  /home/rolltap, added to the image's passwd at start), so root-owned files of the image (its
  /etc/shadow, a verifier's fixtures kept under /root) stay out of its reach. Root without
  CAP_CHOWN cannot give it the workdir, so the daemon does: `hand_over` extracts a copy of the
  workdir, /logs/agent, /logs/artifacts and HOME owned by the agent (setuid and setgid bits
  dropped), and the workdir back to the verifier's user (root) before the tests.
- Privileges: no capability at all (`cap_drop=ALL`; root inside owns the image's files but can
  override no permission, chown nothing, kill no other user's process, open no raw socket) and
  `no-new-privileges` (setuid binaries do not raise anyone). Tasks needing root powers do that
  work in their Dockerfile, whose build keeps docker's defaults.
- Limits: memory and CPUs from the task (spec.limits), and a PID cap (spec.limits.pids, else
  DEFAULT_PIDS_LIMIT) so a fork bomb stays inside.
- Proxy: the socket's directory is mounted read-only at /run/rolltap/proxy and forwarder.py
  (python3 must be in the image) serves it on 127.0.0.1:PORT for the container's lifetime; the
  container's processes get the socket's group, the only one besides its owner that may connect.
- Commands: each exec carries a marker variable; at its timeout every process with that marker
  is SIGKILLed (a process that scrubs its whole environment escapes that, until `reap`), and
  so is what a finished command left running while that still holds its output open; other
  leftovers live until `reap`, which restarts the container: every process in it dies with its
  PID namespace, whatever it did to detach or disguise itself, and the files stay.
- docker-py blocks: every call runs in this provider's own thread pool, sized for one streaming
  exec per concurrent rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import docker
import docker.errors

from ..tasks import Task
from .base import (
    FORWARDER,
    INSIDE_FORWARDER,
    INSIDE_PROXY_DIR,
    LOG_DIRS,
    TIMEOUT_EXIT_CODE,
    Command,
    ExecResult,
    SandboxSpec,
    command_argv,
)
from .docker_copy import chown_trees, get_path, put_bytes, put_dir_entry, put_path
from .docker_exec import ContainerExec
from .docker_images import (
    HARNESS_BUILD_TIMEOUT,
    build_image,
    ensure_image,
    harness_hash,
    has_image,
    image_id,
    task_tag,
)
from .errors import (
    ImageBuildError,
    SandboxCopyError,
    SandboxError,
    SandboxExecError,
    SandboxStartError,
    SandboxUnavailable,
)
from .identity import DEFAULT_SANDBOX_ID
from .workspace import HOME, label, normalize
from .wrapped import egress_args

T = TypeVar("T")

LABEL_RUN = "rolltap.run"
LABEL_ROLLOUT = "rolltap.rollout"
LABEL_TASK = "rolltap.task"
BASE_IMAGE = "rolltap/base:bookworm"
KILL_GRACE_SEC = 5.0
DEFAULT_PIDS_LIMIT = 4096
"""Processes (threads included) a container may hold when the task sets no limit."""
# How often a running command is checked for "exited, but a leftover holds its output open".
EXIT_POLL_SEC = 2.0
AGENT_ID = DEFAULT_SANDBOX_ID
AGENT_NAME = "rolltap"
AGENT_HOME = "/home/rolltap"
"""HOME of an unprivileged agent (never /root: the image may keep what only root may read)."""
_ROOT_USERS = ("", "0", "root", "0:0", "root:root")
_NUMERIC_USER = re.compile(r"(\d+):(\d+)")

# $1 workdir, $2 port, $3 proxy socket inside (or empty), $4 ttl seconds, then the forwarder's
# egress options. The forwarder prints its port on stdout once bound: the container log is how
# create() learns the sandbox is ready.
_INIT = """
mkdir -p "$1" {log_dirs} || exit 1
mkdir -p {home} 2>/dev/null
grep -q '^{agent}:' /etc/passwd 2>/dev/null ||
  echo '{agent}:x:{uid}:{uid}:rolltap agent:{home}:/bin/sh' >> /etc/passwd 2>/dev/null
grep -q '^{agent}:' /etc/group 2>/dev/null || echo '{agent}:x:{uid}:' >> /etc/group 2>/dev/null
port=$2 unix=$3 ttl=$4
shift 4
if [ -n "$unix" ]; then
  python3 -I -S {forwarder} --listen "127.0.0.1:$port" --unix "$unix" "$@" \\
    --ready-file /dev/stdout &
else
  echo ready
fi
exec sleep "$ttl"
""".format(
    log_dirs=" ".join(LOG_DIRS),
    forwarder=INSIDE_FORWARDER,
    agent=AGENT_NAME,
    uid=AGENT_ID,
    home=AGENT_HOME,
)

# $0 an absolute path. Replaces it with an empty directory: a link planted on the way is removed
# (it could lead the verifier's files elsewhere); what cannot be deleted (a subtree whose owner
# locked root out, which root without capabilities cannot override) is moved aside.
_FRESH = """
set -e
d=
for part in $(echo "${0#/}" | tr / ' '); do
  d="$d/$part"
  if [ -L "$d" ]; then rm -f "$d"; elif [ -d "$d" ]; then chmod u+rwx "$d" 2>/dev/null || true; fi
done
chmod -R u+rwX "$0" 2>/dev/null || true
rm -rf "$0" 2>/dev/null || mv "$0" "$(dirname "$0")/.stale-$$-$(basename "$0")"
mkdir -p "$0"
chmod 0755 "$0"
"""
# Prints the uid and gid a user name (or uid) stands for in this image.
_IDS = "id -u; id -g"


class DockerSandbox:
    def __init__(
        self,
        provider: DockerProvider,
        spec: SandboxSpec,
        container_id: str,
        default_user: str,
        environment_built: bool,
        on_close: Callable[[DockerSandbox], None],
    ) -> None:
        self._provider = provider
        self._spec = spec
        self.container_id = container_id
        self._default_user = default_user
        self._environment_built = environment_built
        self._on_close = on_close
        self._closed = False
        self._ran = False  # a command ran since the last reap: something may be left
        self._agent = agent_of(spec.task.agent_user, default_user)
        self._handed: tuple[int, int] | None = None  # the owner hand_over gave the paths to

    @property
    def proxy_url(self) -> str | None:
        return self._spec.proxy_url

    @property
    def workdir(self) -> str:
        return self._spec.task.workdir

    @property
    def home(self) -> str:
        return HOME if self._agent is None else AGENT_HOME

    @property
    def environment_built(self) -> bool:
        return self._environment_built

    @property
    def agent_user(self) -> str | None:
        return self._agent

    async def hand_over(self, user: str | None) -> None:
        if user is None and self._handed is None:
            return  # nothing was handed to an agent: root still owns what it made
        uid, gid = await self._ids(user)
        if self._handed == (uid, gid):
            return
        paths = [self.workdir]
        if self._handed is None:
            paths += ["/logs/agent", "/logs/artifacts", self.home]
            await self._open_the_way_to_mounts()
        missing = await self._chown(paths, uid, gid)
        if missing == [self.home]:
            # The container's start makes it; a task's setup may have removed it.
            made = await self._exec(["mkdir", "-p", self.home], user="0", timeout=60)
            if not made.ok:
                raise SandboxExecError(f"cannot make {self.home}: {made.stderr.strip()[-300:]}")
            missing = await self._chown(missing, uid, gid)
        if missing:
            raise SandboxCopyError(f"{missing[0]} does not exist in the sandbox")
        self._handed = (uid, gid)

    async def _chown(self, paths: list[str], uid: int, gid: int) -> list[str]:
        return await self._provider.run(
            chown_trees, self._provider.raw, self.container_id, paths, uid, gid,
            error=SandboxCopyError,
        )  # fmt: skip

    async def _open_the_way_to_mounts(self) -> None:
        """A harness installed on the host is mounted where it was installed (its scripts name
        that path), often under root's 0700 home: the agent's user may pass through (o+x, no
        listing) each folder above a mount, so it can run the harness, and still reads nothing
        of root's that is not world-readable."""
        above = sorted(
            {
                str(parent)
                for m in self._spec.mounts
                for parent in PurePosixPath(m.inside_path).parents
            }
            - {"/"}
        )
        if not above:
            return
        done = await self._exec(["chmod", "o+x", *above], user="0", timeout=60)
        if not done.ok:
            raise SandboxExecError(f"cannot open the way to the mounts: {done.stderr[-300:]}")

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
        self._ran = True
        return await self._exec(command_argv(cmd), env, cwd, timeout, stdin, user, log)

    async def _exec(
        self,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        user: str | None = None,
        log: Path | None = None,
    ) -> ExecResult:
        if self._closed:
            raise SandboxExecError("the sandbox is closed")
        token = secrets.token_hex(8)
        raw = self._provider.raw
        if stdin is not None:
            path = f"/tmp/.rolltap-stdin-{token}"
            await self._provider.run(
                put_bytes, raw, self.container_id, stdin, path, error=SandboxCopyError
            )
            argv = ["sh", "-c", 'exec 0<"$0"; rm -f "$0"; exec "$@"', path, *argv]
        command = ContainerExec(raw, self.container_id, token, log)
        user = user or self._default_user
        job = asyncio.ensure_future(
            self._provider.run(command.run, argv, dict(env or {}), cwd or self.workdir, user)
        )
        try:
            return await self._finish(job, command, timeout)
        except asyncio.CancelledError:
            await self._kill(command, job)
            raise

    async def put(self, host_path: Path, inside_path: str) -> None:
        inside = normalize(inside_path)
        await self._provider.run(
            put_path, self._provider.raw, self.container_id, host_path, inside,
            error=SandboxCopyError,
        )  # fmt: skip

    async def get(self, inside_path: str, host_path: Path) -> None:
        inside = normalize(inside_path)
        await self._provider.run(
            get_path, self._provider.raw, self.container_id, inside, host_path,
            error=SandboxCopyError,
        )  # fmt: skip

    async def reap(self) -> None:
        if self._closed:
            raise SandboxExecError("the sandbox is closed")
        if not self._ran:
            return
        await self._provider.restart(self.container_id)
        self._ran = False

    async def fresh_dir(self, inside_path: str, *, user: str | None = None) -> None:
        inside = normalize(inside_path)
        done = await self._exec(["sh", "-c", _FRESH, inside], user="0", timeout=60)
        if not done.ok:
            raise SandboxExecError(f"cannot empty {inside}: {done.stderr.strip()[-300:]}")
        uid, gid = await self._ids(user)
        if (uid, gid) == (0, 0):
            return  # root made it, mode 0755: what the archive below would set
        # Root without CAP_CHOWN cannot give it away; the daemon can, by extracting it.
        await self._provider.run(
            put_dir_entry, self._provider.raw, self.container_id, inside, uid, gid,
            error=SandboxCopyError,
        )  # fmt: skip

    async def close(self) -> None:
        self._closed = True
        self._on_close(self)
        await self._provider.run(self._provider.remove, self.container_id)

    async def _ids(self, user: str | None) -> tuple[int, int]:
        """The uid and gid a user name (or uid, or uid:gid) stands for in this image."""
        if user in (None, *_ROOT_USERS):
            return 0, 0
        numeric = _NUMERIC_USER.fullmatch(user)
        if numeric is not None:
            return int(numeric[1]), int(numeric[2])  # what `id` would print as that user
        ids = await self._exec(["sh", "-c", _IDS], user=user, timeout=60)
        found = ids.stdout.split()
        if not ids.ok or len(found) != 2 or not all(x.isdigit() for x in found):
            raise SandboxExecError(f"user {user} is unknown in the image: {ids.stderr}")
        return int(found[0]), int(found[1])

    async def _finish(
        self, job: asyncio.Future[int], command: ContainerExec, timeout: float | None
    ) -> ExecResult:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = EXIT_POLL_SEC if deadline is None else deadline - loop.time()
            done, _ = await asyncio.wait([job], timeout=max(0.0, min(EXIT_POLL_SEC, left)))
            if done:
                return ExecResult(job.result(), command.stdout, command.stderr)
            if deadline is not None and loop.time() >= deadline:
                await self._kill(command, job)
                return ExecResult(TIMEOUT_EXIT_CODE, command.stdout, command.stderr, timed_out=True)
            if command.exec_id and not await self._provider.run(command.running):
                # The command exited, and something it left running holds its output open.
                await self._kill(command, job)
                code = job.result() if job.done() else await self._provider.run(command.exit_code)
                return ExecResult(code, command.stdout, command.stderr)

    async def _kill(self, command: ContainerExec, job: asyncio.Future[int]) -> None:
        # The container may be gone already (closed meanwhile): then so is everything in it.
        with contextlib.suppress(SandboxError):
            await self._provider.run(command.kill)
        done, _ = await asyncio.wait([job], timeout=KILL_GRACE_SEC)
        if not done:
            # Something without the marker still holds the output open: stop reading.
            command.abandon()
            await asyncio.wait([job], timeout=KILL_GRACE_SEC)


def agent_of(task_user: str | None, image_user: str) -> str | None:
    """Who the harness runs as: the task's [agent] user, else the image's own non-root USER,
    else rolltap's agent user; None for root (the exec default)."""
    chosen = task_user if task_user is not None else image_user
    if task_user is None and image_user in _ROOT_USERS:
        chosen = f"{AGENT_ID}:{AGENT_ID}"
    return None if chosen in _ROOT_USERS else chosen


class DockerProvider:
    kind = "docker"

    def __init__(
        self,
        client: docker.DockerClient,
        *,
        base_image: str = BASE_IMAGE,
        ttl_sec: int = 12 * 3600,
        start_timeout_sec: float = 60.0,
        threads: int = 256,
    ) -> None:
        """Use `await DockerProvider.connect()`; this takes a client that answered already."""
        self.client = client
        self.raw: docker.APIClient = client.api
        self._base_image = base_image
        self._ttl_sec = ttl_sec
        self._start_timeout_sec = start_timeout_sec
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="rolltap-docker")
        self._builds: dict[str, asyncio.Lock] = {}
        self._live: set[DockerSandbox] = set()

    @classmethod
    async def connect(
        cls,
        base_url: str | None = None,
        *,
        pool_size: int = 64,
        api_timeout_sec: int = 120,
        **options: Any,
    ) -> DockerProvider:
        """A provider on the daemon at base_url ($DOCKER_HOST, else /var/run/docker.sock)."""
        url = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"

        def make() -> docker.DockerClient:
            client = docker.DockerClient(
                base_url=url, timeout=api_timeout_sec, max_pool_size=pool_size
            )
            client.ping()
            return client

        try:
            client = await asyncio.to_thread(make)
        except docker.errors.DockerException as e:
            raise SandboxUnavailable(f"no docker daemon answers at {url}: {e}") from e
        return cls(client, **options)

    async def run(
        self, fn: Callable[..., T], *args: Any, error: type[SandboxError] = SandboxExecError
    ) -> T:
        """Runs a blocking docker-py call in the pool; docker's errors (and requests', which are
        OSErrors) come back as `error`."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except SandboxError:
            raise
        except (docker.errors.DockerException, OSError) as e:
            raise error(f"docker: {e}") from e

    async def task_image(self, task: Task) -> str:
        """The image of the task's environment, built or found locally (harness images build
        FROM it); the base image for tasks that name none."""
        env = task.environment
        try:
            if env.docker_image is not None:
                await self.run(ensure_image, self.client, env.docker_image, error=ImageBuildError)
                return env.docker_image
            if env.dockerfile_dir is None:
                if env.compose_file is not None:
                    raise ImageBuildError("docker-compose environments are not supported")
                return self._base_image
            tag = task_tag(task.id, env.dockerfile_dir)
            async with self._builds.setdefault(tag, asyncio.Lock()):
                if not await self.run(has_image, self.raw, tag, error=ImageBuildError):
                    await self.run(
                        build_image, self.raw, env.dockerfile_dir, tag, {LABEL_TASK: task.id},
                        env.build_timeout_sec, error=ImageBuildError,
                    )  # fmt: skip
            return tag
        except ImageBuildError as e:
            raise ImageBuildError(f"{task.id}: {e}") from e

    async def harness_image(self, task: Task, name: str, context: Path) -> str:
        """The task's image with a harness installed on top by the Dockerfile in `context`
        (harness_images/<name>/), built once per task image and Dockerfile. The build reaches
        PyPI and npm through the host's network; the containers themselves never do."""
        base = await self.task_image(task)
        base_id = await self.run(image_id, self.raw, base, error=ImageBuildError)
        tag = f"rolltap-harness/{label(name).lower()}:{harness_hash(base_id, context)}"
        async with self._builds.setdefault(tag, asyncio.Lock()):
            if not await self.run(has_image, self.raw, tag, error=ImageBuildError):
                await self.run(
                    build_image, self.raw, context, tag, {LABEL_TASK: task.id},
                    HARNESS_BUILD_TIMEOUT, {"BASE": base}, "host", error=ImageBuildError,
                )  # fmt: skip
        return tag

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        image = spec.image or await self.task_image(spec.task)
        environment_built = spec.task.environment.has_image
        container_id, user = await self.run(self._start, spec, image, error=SandboxStartError)
        try:
            await self._wait_ready(container_id, 0)
        except BaseException:
            with contextlib.suppress(SandboxError):
                await self.run(self.remove, container_id)
            raise
        sandbox = DockerSandbox(
            self, spec, container_id, user, environment_built, self._live.discard
        )
        self._live.add(sandbox)
        return sandbox

    async def sweep(self, run_id: str) -> int:
        def sweep() -> int:
            found = self.raw.containers(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})
            for c in found:
                self.remove(c["Id"])
            return len(found)

        return await self.run(sweep, error=SandboxError)

    async def close(self) -> None:
        for sandbox in list(self._live):
            with contextlib.suppress(SandboxError):
                await sandbox.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    async def restart(self, container_id: str) -> None:
        """Kills everything in the container at once (its PID 1 first, then the kernel takes
        the rest of its PID namespace) and starts its main process again, files kept."""
        logged = await self.run(self._logs, container_id, True) or b""
        await self.run(self.raw.restart, container_id, 0)
        await self._wait_ready(container_id, len(logged))

    def remove(self, container_id: str) -> None:
        try:
            self.raw.remove_container(container_id, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            # 409: the daemon is removing it already (auto_remove after the main process ended).
            if e.status_code != 409:
                raise

    def _start(self, spec: SandboxSpec, image: str) -> tuple[str, str]:
        """Creates and starts the container; returns its id and the image's default user."""
        try:
            config = self.raw.inspect_image(image)["Config"] or {}
        except docker.errors.ImageNotFound as e:
            raise ImageBuildError(f"image {image} is not present") from e
        binds = {str(m.host_path): {"bind": m.inside_path, "mode": "ro" if m.read_only else "rw"}
                 for m in spec.mounts}  # fmt: skip
        unix = ""
        groups = []
        if spec.proxy_socket is not None:
            binds[str(FORWARDER)] = {"bind": INSIDE_FORWARDER, "mode": "ro"}
            binds[str(spec.proxy_socket.parent)] = {"bind": INSIDE_PROXY_DIR, "mode": "ro"}
            unix = f"{INSIDE_PROXY_DIR}/{spec.proxy_socket.name}"
            # Root in here cannot override permissions: the socket's group lets it connect.
            groups = [str(spec.proxy_socket.stat().st_gid)]
        limits = spec.limits
        memory = f"{limits.memory_mb}m" if limits.memory_mb else None
        host_config = self.raw.create_host_config(
            binds=binds,
            network_mode="none",
            init=True,
            auto_remove=False,  # see the module docstring: a restart must keep the container
            mem_limit=memory,
            memswap_limit=memory,
            pids_limit=limits.pids or DEFAULT_PIDS_LIMIT,
            nano_cpus=int(limits.cpus * 1e9) if limits.cpus else None,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            group_add=groups,
        )
        created = self.raw.create_container(
            image,
            entrypoint=["/bin/sh", "-c", _INIT, "rolltap-init"],
            command=[
                *(spec.task.workdir, str(spec.proxy_port), unix, str(self._ttl_sec)),
                *egress_args(spec),
            ],
            user="0:0",
            working_dir=spec.task.workdir,
            environment=dict(spec.env),
            labels={
                LABEL_RUN: spec.run_id,
                LABEL_ROLLOUT: spec.rollout_id,
                LABEL_TASK: spec.task.id,
            },
            host_config=host_config,
        )
        container_id = str(created["Id"])
        try:
            self.raw.start(container_id)
        except docker.errors.APIError:
            self.remove(container_id)
            raise
        return container_id, str(config.get("User") or "")

    async def _wait_ready(self, container_id: str, logged: int) -> None:
        """Waits for the main process to say it is ready, past the `logged` bytes of stdout
        earlier starts of the container wrote."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._start_timeout_sec
        while loop.time() < deadline:
            out = await self.run(self._logs, container_id, True, error=SandboxStartError)
            if out is not None and out[logged:].strip():
                return
            if out is None or not await self.run(self._running, container_id):
                raise SandboxStartError("the container ended while starting")
            await asyncio.sleep(0.02)
        err = await self.run(self._logs, container_id, False, error=SandboxStartError) or b""
        detail = err.decode("utf-8", "replace").strip()[-500:] or "no output"
        raise SandboxStartError(f"the sandbox did not get ready: {detail}")

    def _running(self, container_id: str) -> bool:
        try:
            state = self.raw.inspect_container(container_id)["State"]
        except docker.errors.NotFound:
            return False
        return bool(state.get("Running"))

    def _logs(self, container_id: str, stdout: bool) -> bytes | None:
        """The container's stdout (or stderr) so far; None once it is gone or going (404, 409:
        removed, or being removed)."""
        try:
            logs: bytes = self.raw.logs(container_id, stdout=stdout, stderr=not stdout)
        except docker.errors.APIError as e:
            if e.status_code in (404, 409):
                return None
            raise
        return logs
