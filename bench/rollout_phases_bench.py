"""Runner phase benchmark: one rollout's cost split into its phases, for each sandbox kind.

    python bench/rollout_phases_bench.py [--kinds bwrap,docker,local] [--n 20]
                                         [--baseline GIT_REF] [--harness single-call]

Runs `--n` trivial rollouts one after another (plus one before and one after, not counted: the
first warms caches, the last also pays the batch's end) through the real pipeline: `run_batch`
with the `oracle` harness (no model, no call; its solution writes one file, its test checks
it), the batch's own proxy and a SQLite store. `--harness single-call` runs rolltap's smallest
real harness instead: one model call, answered by the fake vLLM engine in a process of its own
(its CPU not counted; the proxy's is, in the runner's process). A wrapper around the sandbox
provider notes the CPU and wall clock at each sandbox operation's start and end, and holds each
rollout's sandbox until the one before has finished, so one rollout runs at a time. Per
rollout, by phase:

- sandbox: the provider's create and close (workspace made and removed; container started and
  removed), and `reap` (docker restarts the container so nothing the agent left runs on);
- provision: the task put in and set up, the workspace surveyed and its git history pruned
  (runner/guard.py): the commands logged to setup.log;
- harness: the harness's command, with what the sandbox wraps it in (bwrap, the proxy
  forwarder); `harness files`: its files copied in and its logs out;
- verify: the verifier's fresh sandbox made, set up, given the agent's workdir and removed
  (runner/grading.py), /tests and /logs/verifier made fresh, the tests copied in and run, the
  results out;
- record: the runner's own time between sandbox operations: the rollout's store writes
  (provenance, audit, status, revocation, reward, hack flags, analysis), its logs and tails.

CPU is user + system seconds: "runner", the runner's process (its proxy and the store's writer
thread included); "children", everything it starts (setpriv, bwrap, the forwarder, the command),
counted by a cpuacct cgroup the measuring process joins (rusage misses what runs in bwrap's PID
namespace: 2 of 12 ms for `python3 -c pass` here), by rusage where no cgroup can be made;
"daemons", for docker, dockerd's and containerd's, each container's shim's and the containers'
own processes' (their cgroups). dockerd and containerd serve the whole machine: another user's
docker work in the same seconds lands there too. "Runner overhead without the harness's own
start" is the total less what the harness's command costs beyond an empty command (`true`,
behind the same forwarder) in the same kind of sandbox.

`--baseline REF` runs the same measurement on another commit's code (a git worktree of REF,
imported ahead of this tree) for each kind, in the same run, and prints both side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STAGE = "/logs/.rolltap-pristine"
"""runner/verify.py's STAGE (a baseline tree may not have that module to import it from)."""

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("sandbox", "provision", "harness", "harness files", "verify", "record")
COLUMNS = ("wall", "runner", "children", "daemons")
SOLUTION = "echo done > answer.txt"
TEST = "test -s answer.txt"


@dataclass(frozen=True)
class Reading:
    wall: float
    runner: float
    children: float
    daemons: float

    def minus(self, other: Reading) -> tuple[float, float, float, float]:
        return (
            self.wall - other.wall,
            self.runner - other.runner,
            self.children - other.children,
            self.daemons - other.daemons,
        )


class CpuGroup:
    """A cpuacct cgroup (v1) holding this process and whatever it starts. rusage's children
    figure misses what runs inside bwrap (its PID namespace's processes are not waited for by
    the bwrap this process waits for: 2 ms counted of 12 ms for `python3 -c pass` here); the
    cgroup counts every descendant. None where cgroups cannot be made (then rusage)."""

    usage: Path | None = None

    @contextlib.contextmanager
    def joined(self) -> Iterator[None]:
        base = Path("/sys/fs/cgroup/cpuacct")
        group = base / f"rolltap-phases-{os.getpid()}"
        try:
            group.mkdir()
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            yield
            return
        self.usage = group / "cpuacct.usage"
        try:
            yield
        finally:
            self.usage = None
            (base / "cgroup.procs").write_text(str(os.getpid()))
            with contextlib.suppress(OSError):
                group.rmdir()


GROUP = CpuGroup()


class Daemons:
    """CPU seconds of dockerd and containerd, and of the shims and cgroups of this bench's own
    containers, summed over every one seen (a shim or a container that went keeps its last
    reading; one seen for the first time counts whole, since it started in the interval)."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}
        self.containers: set[str] = set()

    def total(self) -> float:
        import psutil

        for p in psutil.process_iter(["name", "cmdline"]):
            name = p.info["name"] or ""
            if name.startswith("containerd-shim"):
                args = p.info["cmdline"] or []
                if not any(a in self.containers for a in args):
                    continue
            elif name not in ("dockerd", "containerd"):
                continue
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                used = t.user + t.system + t.children_user + t.children_system
                self.last[f"pid {p.pid} {p.create_time()}"] = used
        cgroups = Path("/sys/fs/cgroup/cpuacct/docker")
        for container in self.containers:
            with contextlib.suppress(OSError, ValueError):
                usage = int((cgroups / container / "cpuacct.usage").read_text()) / 1e9
                self.last[f"cgroup {container}"] = usage
        return sum(self.last.values())


class Meter:
    """Attributes CPU and wall time to (rollout, phase) between readings."""

    def __init__(self, docker: bool) -> None:
        self.daemons = Daemons() if docker else None
        self.spent: dict[str, dict[str, list[float]]] = {}
        self.measuring = 0.0
        self.last = self.read()

    def read(self) -> Reading:
        wall = time.perf_counter()
        own = resource.getrusage(resource.RUSAGE_SELF)
        mine = own.ru_utime + own.ru_stime
        if GROUP.usage is not None:
            children = GROUP.usage.read_text()
            kids = int(children) / 1e9 - mine
        else:
            usage = resource.getrusage(resource.RUSAGE_CHILDREN)
            kids = usage.ru_utime + usage.ru_stime
        daemons = 0.0
        if self.daemons is not None:
            # Scanning /proc costs this process CPU: kept out of the runner's figures.
            t0 = time.process_time()
            daemons = self.daemons.total()
            self.measuring += time.process_time() - t0
        return Reading(wall, mine - self.measuring, kids, daemons)

    def mark(self, rollout: str, phase: str) -> None:
        """The time since the last mark was spent by `rollout` in `phase`."""
        now = self.read()
        row = self.spent.setdefault(rollout, {p: [0.0] * len(COLUMNS) for p in PHASES})[phase]
        for i, value in enumerate(now.minus(self.last)):
            row[i] += value
        self.last = now


def _graded(rollout_id: str) -> str | None:
    """The rollout a grading sandbox's spec belongs to; None for a rollout's own sandbox (and
    for every sandbox of a baseline tree older than runner/grading.py)."""
    try:
        from rolltap.runner.grading import GRADING_SUFFIX
    except ImportError:
        return None
    return rollout_id.removesuffix(GRADING_SUFFIX) if rollout_id.endswith(GRADING_SUFFIX) else None


class MeteredSandbox:
    def __init__(
        self,
        inner: Any,
        meter: Meter,
        rollout: str,
        workdir: str,
        turn: Turns,
        grading: bool = False,
    ) -> None:
        """grading: the verifier's fresh sandbox, every operation of which is verify time."""
        self._grading = grading
        self._inner = inner
        self._meter = meter
        self._rollout = rollout
        self._workdir = workdir.rstrip("/")
        self._turn = turn
        self._harness_started = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def _op(self, phase: str, op: Any, *args: Any, **kwargs: Any) -> Any:
        phase = "verify" if self._grading else phase
        self._meter.mark(self._rollout, "record")
        try:
            return await op(*args, **kwargs)
        finally:
            self._meter.mark(self._rollout, phase)

    def _by_path(self, inside: str) -> str:
        # runner/verify.py's stages: the workdir's test files kept before the agent, put back
        # before the tests.
        if inside.startswith(f"{STAGE}-keep-"):
            return "provision"
        if inside.startswith(("/tests", "/logs/verifier", f"{STAGE}-restore-")):
            return "verify"
        if inside == self._workdir or inside.startswith(self._workdir + "/"):
            return "provision"
        return "harness files"

    async def exec(self, cmd: Any, **kwargs: Any) -> Any:
        log = kwargs.get("log")
        name = Path(log).name if log is not None else ""
        phase = {"setup.log": "provision", "harness.log": "harness"}.get(name, "verify")
        return await self._op(phase, self._inner.exec, cmd, **kwargs)

    async def put(self, host_path: Path, inside_path: str) -> Any:
        phase = self._by_path(inside_path)
        if phase == "harness files" and not self._harness_started and not self._grading:
            self._harness_started = True
            # The next rollout's first store writes (made as soon as this one left its
            # setup) land in this rollout's record time, not in its harness.
            await self._turn.next_arrived(self._rollout)
        return await self._op(phase, self._inner.put, host_path, inside_path)

    async def get(self, inside_path: str, host_path: Path) -> Any:
        return await self._op(self._by_path(inside_path), self._inner.get, inside_path, host_path)

    async def fresh_dir(self, inside_path: str, **kwargs: Any) -> Any:
        return await self._op("verify", self._inner.fresh_dir, inside_path, **kwargs)

    async def hand_over(self, user: str | None) -> Any:
        return await self._op("harness files", self._inner.hand_over, user)

    async def reap(self) -> Any:
        return await self._op("sandbox", self._inner.reap)

    async def close(self) -> Any:
        return await self._op("sandbox", self._inner.close)


class Turns:
    """One rollout at a time: a sandbox is made once every earlier rollout has finished."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.created: list[str] = []
        self.finished = 0
        self.changed = asyncio.Event()

    async def _until(self, done: Any) -> None:
        while not done():
            self.changed.clear()
            await self.changed.wait()

    def poke(self) -> None:
        self.changed.set()

    async def my_turn(self, rollout: str) -> None:
        self.created.append(rollout)
        self.poke()
        position = len(self.created) - 1
        await self._until(lambda: self.finished >= position)

    async def next_arrived(self, rollout: str) -> None:
        position = self.created.index(rollout)
        if position + 1 < self.total:
            await self._until(lambda: len(self.created) > position + 1)


class Finished(list[Any]):
    """BatchProgress.finished: each rollout appended as its record is complete."""

    def __init__(self, turns: Turns) -> None:
        super().__init__()
        self._turns = turns

    def append(self, item: Any) -> None:
        super().append(item)
        self._turns.finished += 1
        self._turns.poke()


class MeteredProvider:
    def __init__(self, inner: Any, meter: Meter, turns: Turns) -> None:
        self.inner = inner
        self.kind = inner.kind
        self._meter = meter
        self._turns = turns

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def create(self, spec: Any) -> Any:
        owner = _graded(spec.rollout_id)
        if owner is not None:
            # The verifier's fresh sandbox (runner/grading.py): made while its rollout's own
            # still lives, so it takes no turn; all of it is that rollout's verify phase.
            self._meter.mark(owner, "record")
            box = await self.inner.create(spec)
            if self._meter.daemons is not None:
                self._meter.daemons.containers.add(box.container_id)
            self._meter.mark(owner, "verify")
            return MeteredSandbox(box, self._meter, owner, spec.task.workdir, self._turns, True)
        await self._turns.my_turn(spec.rollout_id)
        previous = self._turns.created[-2] if len(self._turns.created) > 1 else "batch start"
        self._meter.mark(previous, "record")
        box = await self.inner.create(spec)
        if self._meter.daemons is not None:
            self._meter.daemons.containers.add(box.container_id)
        self._meter.mark(spec.rollout_id, "sandbox")
        return MeteredSandbox(box, self._meter, spec.rollout_id, spec.task.workdir, self._turns)

    async def sweep(self, run_id: str) -> int:
        return int(await self.inner.sweep(run_id))

    async def close(self) -> None:
        await self.inner.close()


class MeteredImages(MeteredProvider):
    """A provider that builds images (docker), as the pipeline checks for by its methods."""

    async def task_image(self, task: Any) -> str:
        return str(await self.inner.task_image(task))

    async def harness_image(self, task: Any, name: str, context: Path) -> str:
        return str(await self.inner.harness_image(task, name, context))


async def empty_exec(provider: Any, task: Any, sock: Path, n: int) -> list[float]:
    """CPU of `true` run in one sandbox of the kind, with the proxy forwarder in front, as the
    harness's command is run (the same wrapper, nothing inside)."""
    from rolltap.runner.sandboxes.base import SandboxSpec

    spec = SandboxSpec(task=task, run_id="phase-bench", rollout_id="empty", proxy_socket=sock)
    box = await provider.create(spec)
    meter = Meter(provider.kind == "docker")
    if meter.daemons is not None:
        meter.daemons.containers.add(box.container_id)
    try:
        await box.exec(["true"])  # warm-up
        meter.mark("-", "record")
        for _ in range(n):
            result = await box.exec(["true"])
            if result.exit_code != 0:
                raise RuntimeError(f"`true` failed: {result.stderr}")
        meter.mark("empty", "harness")
    finally:
        await box.close()
    return [v / n for v in meter.spent["empty"]["harness"]]


async def measure(
    kind: str, n: int, tmp: Path, harness: str, backends: list[str]
) -> dict[str, Any]:
    from rolltap.runner import BatchProgress, run_batch
    from rolltap.runner.sandboxes.kinds import make_provider

    tasks = tmp / "trivial.jsonl"
    lines = [
        json.dumps(
            {"id": f"t{i:03d}", "instruction": "Say hi.", "solution": SOLUTION, "test": TEST}
        )
        for i in range(n + 2)
    ]
    tasks.write_text("\n".join(lines) + "\n")
    root = tmp / "boxes"
    root.mkdir()
    root.chmod(0o711)  # as root, bwrap runs as the sandbox user, who must reach its workspaces
    inner = await make_provider(kind, root=root)
    turns = Turns(n + 2)
    meter = Meter(kind == "docker")
    metered = MeteredImages if hasattr(inner, "task_image") else MeteredProvider
    provider = metered(inner, meter, turns)
    progress = BatchProgress(finished=Finished(turns))
    try:
        result = await run_batch(
            tasks,
            harness=harness,
            sandbox=provider,
            backends=backends,
            concurrency=1,
            db=f"sqlite:///{tmp / 'store.sqlite'}",
            logs_root=tmp / "logs",
            progress=progress,
        )
        bad = [r for r in result.results if r.reward != 1.0]
        if bad:
            raise RuntimeError(f"{len(bad)} rollouts failed: {bad[0].error}")
        sock_dir = Path(tempfile.mkdtemp(prefix="rt-phase-", dir="/tmp"))
        try:
            empty = await _with_socket(sock_dir, inner, tasks, n)
        finally:
            shutil.rmtree(sock_dir, ignore_errors=True)
    finally:
        await inner.close()
    order = turns.created[1:-1]  # the first warms up; the last also pays the batch's end
    per_phase = {
        phase: [sum(meter.spent[r][phase][i] for r in order) / len(order) for i in range(4)]
        for phase in PHASES
    }
    return {"kind": kind, "n": len(order), "phases": per_phase, "empty": empty}


async def _with_socket(directory: Path, provider: Any, tasks: Path, n: int) -> list[float]:
    """An empty exec behind a listening proxy socket, as the batch's sandboxes had."""
    from aiohttp import web

    from rolltap.runner.sandboxes.identity import sandbox_user
    from rolltap.runner.tasks import load_tasks

    task = load_tasks(tasks)[0]
    runner = web.AppRunner(web.Application())
    await runner.setup()
    sock = directory / "proxy.sock"
    await web.UnixSite(runner, str(sock)).start()
    group = sandbox_user().gid
    os.chown(sock, -1, group)
    sock.chmod(0o660)
    os.chown(directory, -1, group)
    directory.chmod(0o750)
    try:
        return await empty_exec(provider, task, sock, max(5, n))
    finally:
        await runner.cleanup()


def table(results: list[dict[str, Any]]) -> None:
    """Per phase, ms per rollout: wall, then CPU (runner / children / daemons / all)."""
    header = f"{'':<24}{'phase':<15}{'wall':>8}{'CPU':>8}{'runner':>8}{'children':>9}"
    header += f"{'daemons':>8}"
    print(header)
    for res in results:
        label = res["label"]
        total = [0.0] * 4
        for phase in PHASES:
            row = res["phases"][phase]
            total = [a + b for a, b in zip(total, row, strict=True)]
            print(_line(label, phase, row))
            label = ""
        print(_line("", "total", total))
        empty = res["empty"]
        harness = res["phases"]["harness"]
        own = sum(harness[1:]) - sum(empty[1:])
        print(_line("", "(empty exec)", empty))
        print(
            f"{'':<24}runner overhead without the harness's own start: "
            f"{(sum(total[1:]) - max(0.0, own)) * 1e3:.0f} ms CPU "
            f"(harness command beyond an empty one: {own * 1e3:.0f} ms)"
        )


def _line(label: str, phase: str, row: list[float]) -> str:
    wall, runner, children, daemons = (v * 1e3 for v in row)
    cpu = runner + children + daemons
    return f"{label:<24}{phase:<15}{wall:8.1f}{cpu:8.1f}{runner:8.1f}{children:9.1f}{daemons:8.1f}"


@contextlib.contextmanager
def fake_engine(log: Path) -> Iterator[str]:
    """The fake vLLM engine (tests/support/fake_vllm.py) in its own process: its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "tests.support.fake_vllm", "--port", str(port)]
    with log.open("wb") as err:
        proc = subprocess.Popen([*cmd, "--reply-tokens", "16"], cwd=ROOT, stderr=err)
    try:
        for _ in range(300):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait()


@contextlib.contextmanager
def baseline_tree(ref: str) -> Iterator[Path]:
    """A worktree of `ref` and a folder that imports its packages as `rolltap.*`."""
    work = Path(tempfile.mkdtemp(prefix="rolltap-baseline-"))
    tree = work / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), ref], cwd=ROOT, check=True,
                   capture_output=True)  # fmt: skip
    try:
        setup = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]
        if "package-dir" not in setup:
            yield tree  # rolltap/ links its packages in (rolltap/proxy -> ../proxy)
            return
        if setup["package-dir"] == {"rolltap": "."}:
            # The root is the package: a folder whose rolltap is the whole tree.
            shim = work / "shim"
            shim.mkdir()
            (shim / "rolltap").symlink_to(tree)
            yield shim
            return
        # Older layouts map the packages from the top level (package-dir): link them the same.
        shim = work / "shim"
        (shim / "rolltap").mkdir(parents=True)
        for entry in (tree / "rolltap").iterdir():
            (shim / "rolltap" / entry.name).symlink_to(entry)
        for name, folder in setup["package-dir"].items():
            parts = name.split(".")
            if len(parts) == 2 and parts[0] == "rolltap":
                link = shim / "rolltap" / parts[1]
                if not link.exists():
                    link.symlink_to(tree / folder)
        yield shim
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                       capture_output=True)  # fmt: skip
        shutil.rmtree(work, ignore_errors=True)


def run_child(kind: str, n: int, harness: str, shim: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    if shim is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(shim), env.get("PYTHONPATH", "")]).rstrip(":")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--kinds", kind, "--n", str(n)]
    cmd += ["--harness", harness]
    done = subprocess.run([*cmd, "--json"], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return {"kind": kind, "error": done.stderr.strip().splitlines()[-1:]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="bwrap,docker,local")
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--baseline", help="also measure this git ref's code, side by side")
    parser.add_argument(
        "--harness",
        default="oracle",
        choices=["oracle", "single-call"],
        help="single-call: one model call per rollout, to the fake engine, through the proxy",
    )
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    if args.json:
        with tempfile.TemporaryDirectory(prefix="rolltap-phases-") as tmp:
            tmp_path = Path(tmp)
            tmp_path.chmod(0o711)
            with contextlib.ExitStack() as stack:
                backends = []
                if args.harness != "oracle":
                    # Started before this process joins its cgroup: the engine's CPU is not
                    # the runner's (the proxy's is: it runs in the runner's process).
                    backends = [stack.enter_context(fake_engine(tmp_path / "engine.log"))]
                with GROUP.joined():
                    measured = await measure(kinds[0], args.n, tmp_path, args.harness, backends)
                    measured["cgroup"] = GROUP.usage is not None
            print(json.dumps(measured))
        return
    print(f"{args.n} {args.harness} rollouts one at a time per kind; ms per rollout; load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")  # fmt: skip
    with contextlib.ExitStack() as stack:
        shim = stack.enter_context(baseline_tree(args.baseline)) if args.baseline else None
        results = []
        for kind in kinds:
            contenders: list[tuple[str, Path | None]] = [("this tree", None)]
            if shim is not None:
                contenders.insert(0, (f"{args.baseline}", shim))
            for label, path in contenders:
                res = run_child(kind, args.n, args.harness, path)
                if "error" in res:
                    print(f"{kind} ({label}): skipped: {res['error']}")
                    continue
                res["label"] = f"{kind} ({label})"
                results.append(res)
        table(results)


if __name__ == "__main__":
    asyncio.run(main())
