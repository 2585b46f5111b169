"""Tasks: the typed model and its loaders (Harbor task directories and the JSONL shorthand).

A Harbor task directory holds task.toml, instruction.md, environment/ (Dockerfile), tests/test.sh
and optionally solution/solve.sh. So that one definition runs in every sandbox kind, an
environment may also carry files/ (copied into the workdir) and setup.sh (run in the workdir)
for kinds that build no image; a Dockerfile must do the same two things on top of its base
(see examples/tasks/README.md).

The JSONL shorthand is one object per line: id, instruction, setup, test, and optionally
solution, workdir, docker_image, agent_timeout_sec, verifier_timeout_sec, verifier_sandbox. Its
test passes (reward 1) on exit 0 unless it writes the reward file itself.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

__all__ = [
    "Task",
    "TaskAudit",
    "TaskEnvironment",
    "TaskFormatError",
    "VerifierSandbox",
    "load_tasks",
    "parse_jsonl",
]

DEFAULT_WORKDIR = "/app"
DEFAULT_AGENT_TIMEOUT_SEC = 600.0
DEFAULT_VERIFIER_TIMEOUT_SEC = 600.0
DEFAULT_BUILD_TIMEOUT_SEC = 600.0

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)
_WORKDIR_LINE = re.compile(r"^\s*WORKDIR\s+(\S+)\s*$", re.IGNORECASE | re.MULTILINE)
_JSONL_KEYS = {
    "id",
    "instruction",
    "setup",
    "test",
    "solution",
    "workdir",
    "docker_image",
    "agent_timeout_sec",
    "verifier_timeout_sec",
    "verifier_sandbox",
}


class TaskFormatError(ValueError):
    """A task that cannot be loaded; the message names the file and the problem."""

    def __init__(self, where: Path | str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = str(where)
        self.problem = problem


class VerifierSandbox(StrEnum):
    """Where the task's tests run (task.toml `[verifier] sandbox`, rolltap's own key; JSONL
    `verifier_sandbox`)."""

    FRESH = "fresh"
    """A new sandbox from the task's own environment, set up again, holding the agent's workdir
    and nothing else of its run (runner/grading.py): what the agent changed outside the
    workdir, as root in docker too, and any process it left are not there."""
    AGENT = "agent"
    """The sandbox the agent ran in, once nothing of the agent runs (Harbor's way): for tasks
    whose tests check the environment beyond the workdir (a service set up, a file in /etc)."""


@dataclass(frozen=True)
class TaskEnvironment:
    """Where a task runs and what it needs there."""

    dockerfile_dir: Path | None = None
    """The build context (environment/) when it holds a Dockerfile."""
    docker_image: str | None = None
    """A prebuilt image named by task.toml; wins over the Dockerfile, as in Harbor."""
    compose_file: Path | None = None
    """environment/docker-compose.yaml, which no sandbox kind runs yet."""
    files_dir: Path | None = None
    """environment/files/: copied into the workdir where no image is built."""
    setup_script: str | None = None
    """environment/setup.sh (or JSONL `setup`): run in the workdir where no image is built."""
    cpus: float | None = None
    memory_mb: int | None = None
    allow_internet: bool = True
    """Harbor's default. Without `rolltap run --egress` sandboxes reach only the proxy; with it,
    true means the run's allow-list (plus allowed_hosts), false means no host at all."""
    allowed_hosts: tuple[str, ...] = ()
    """rolltap's addition to [environment]: host patterns this task may reach with egress."""
    build_timeout_sec: float = DEFAULT_BUILD_TIMEOUT_SEC
    env: Mapping[str, str] = field(default_factory=dict)
    prune_git_history: bool = True
    """rolltap's addition to [environment]: a workdir in a git repository keeps only what its
    base commit sees (runner/guard.py); false keeps its branches, tags, reflogs and objects."""

    @property
    def has_image(self) -> bool:
        """True when image-based kinds take the environment from the task's own image."""
        return self.docker_image is not None or self.dockerfile_dir is not None


@dataclass(frozen=True)
class TaskAudit:
    """task.toml [audit] (rolltap's own table; Harbor ignores it): what the reward-hack detectors
    should know of the task (analysis/detectors.py)."""

    upstream: tuple[str, ...] = ()
    """Where the task's code comes from (`github.com/acme/lib`, a host, a URL): fetching it is
    flagged. The remotes of the task's repository count too, without being listed."""
    packages: tuple[str, ...] = ()
    """The code under test as a package index names it: installing it is flagged. The workdir's
    own top-level packages count too."""
    protected_paths: tuple[str, ...] = ()
    """Paths (relative to the workdir, or absolute; globs allowed) the verifier relies on besides
    /tests and /logs/verifier: reading or writing them is flagged."""


@dataclass(frozen=True)
class Task:
    id: str
    instruction: str
    source: Path
    """The task directory, or the JSONL file the task came from."""
    workdir: str
    environment: TaskEnvironment
    agent_timeout_sec: float = DEFAULT_AGENT_TIMEOUT_SEC
    agent_user: str | None = None
    verifier_timeout_sec: float = DEFAULT_VERIFIER_TIMEOUT_SEC
    verifier_user: str | None = None
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    verifier_sandbox: VerifierSandbox = VerifierSandbox.FRESH
    tests_dir: Path | None = None
    """Copied to /tests after the agent ran; holds test.sh."""
    test_script: str | None = None
    """An inline test.sh (JSONL tasks)."""
    reward_from_exit_code: bool = False
    """Without a reward file, exit 0 scores 1 and anything else 0 (JSONL tasks)."""
    solution_dir: Path | None = None
    """Copied to /solution for the oracle; holds solve.sh."""
    solution_script: str | None = None
    solution_env: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    entry_hash: str | None = None
    """A JSONL task's content hash: `sha256:` + SHA-256 of its line's canonical JSON."""
    audit: TaskAudit = field(default_factory=TaskAudit)


def load_tasks(path: Path | str) -> list[Task]:
    """Tasks from a task directory, a directory of task directories, or a .jsonl file."""
    path = Path(path)
    if path.is_file():
        if path.suffix != ".jsonl":
            raise TaskFormatError(path, "expected a .jsonl file or a directory")
        return _unique(_load_jsonl(path), path)
    if not path.is_dir():
        raise TaskFormatError(path, "no such file or directory")
    if (path / "task.toml").is_file():
        return [_load_task_dir(path)]
    dirs = sorted(d for d in path.iterdir() if (d / "task.toml").is_file())
    jsonls = sorted(f for f in path.iterdir() if f.is_file() and f.suffix == ".jsonl")
    if not dirs and not jsonls:
        raise TaskFormatError(path, "holds no task directory (task.toml) and no .jsonl file")
    tasks = [_load_task_dir(d) for d in dirs]
    for f in jsonls:
        tasks.extend(_load_jsonl(f))
    return _unique(tasks, path)


def strip_canary(text: str) -> str:
    """Drops leading canary marker lines (training-data provenance), as Harbor does."""
    lines = text.split("\n")
    i = 0
    while i < len(lines) and _CANARY.match(lines[i].strip()):
        i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    return "\n".join(lines[i:])


def _unique(tasks: list[Task], where: Path) -> list[Task]:
    seen: dict[str, Path] = {}
    for t in tasks:
        if t.id in seen:
            twice = f"task id {t.id!r} appears twice ({seen[t.id]}, {t.source})"
            raise TaskFormatError(where, twice)
        seen[t.id] = t.source
    return tasks


def _load_task_dir(d: Path) -> Task:
    d = d.resolve()
    toml_path = d / "task.toml"
    try:
        config = tomllib.loads(toml_path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TaskFormatError(toml_path, f"not valid TOML: {e}") from e
    if "steps" in config:
        raise TaskFormatError(toml_path, "multi-step tasks ([[steps]]) are not supported")
    if not _ID.match(d.name):
        raise TaskFormatError(d, "a task directory name must match [A-Za-z0-9][A-Za-z0-9_.-]*")
    instruction_path = d / "instruction.md"
    if not instruction_path.is_file():
        raise TaskFormatError(d, "missing instruction.md")
    instruction = strip_canary(instruction_path.read_text())
    if not instruction.strip():
        raise TaskFormatError(instruction_path, "empty instruction")
    tests_dir = d / "tests"
    if not (tests_dir / "test.sh").is_file():
        raise TaskFormatError(d, "missing tests/test.sh")
    solution_dir = d / "solution"
    has_solution = (solution_dir / "solve.sh").is_file()

    agent = _table(config, "agent", toml_path)
    verifier = _table(config, "verifier", toml_path)
    solution = _table(config, "solution", toml_path)
    env_table = _table(config, "environment", toml_path)
    where = f"{toml_path} [environment]"
    environment = _environment(d / "environment", env_table, where)
    workdir = _opt_str(env_table, "workdir", where) or _dockerfile_workdir(d / "environment")
    return Task(
        id=d.name,
        instruction=instruction,
        source=d,
        workdir=_abs_path(workdir or DEFAULT_WORKDIR, where),
        environment=environment,
        agent_timeout_sec=_timeout(agent, f"{toml_path} [agent]", DEFAULT_AGENT_TIMEOUT_SEC),
        agent_user=_opt_user(agent, f"{toml_path} [agent]"),
        verifier_timeout_sec=_timeout(
            verifier, f"{toml_path} [verifier]", DEFAULT_VERIFIER_TIMEOUT_SEC
        ),
        verifier_user=_opt_user(verifier, f"{toml_path} [verifier]"),
        verifier_env=_str_map(verifier, "env", f"{toml_path} [verifier]"),
        verifier_sandbox=_verifier_sandbox(verifier, "sandbox", f"{toml_path} [verifier]"),
        tests_dir=tests_dir,
        solution_dir=solution_dir if has_solution else None,
        solution_env=_str_map(solution, "env", f"{toml_path} [solution]"),
        metadata=_table(config, "metadata", toml_path),
        audit=_audit(_table(config, "audit", toml_path), f"{toml_path} [audit]"),
    )


def _environment(env_dir: Path, table: dict[str, Any], where: str) -> TaskEnvironment:
    dockerfile = env_dir / "Dockerfile"
    compose = env_dir / "docker-compose.yaml"
    files = env_dir / "files"
    setup = env_dir / "setup.sh"
    memory = table.get("memory_mb")
    if memory is not None and (not isinstance(memory, int) or memory <= 0):
        raise TaskFormatError(where, "memory_mb must be a positive integer")
    if "memory" in table:
        # Harbor's older spelling, still read by Harbor: "2G", "512M".
        legacy = _size_mb(table["memory"], where)
        if memory is not None and memory != legacy:
            raise TaskFormatError(where, f"memory ({legacy} MB) and memory_mb ({memory}) differ")
        memory = legacy
    cpus = table.get("cpus")
    if cpus is not None and (not isinstance(cpus, int | float) or cpus <= 0):
        raise TaskFormatError(where, "cpus must be a positive number")
    allow = table.get("allow_internet", True)
    if not isinstance(allow, bool):
        raise TaskFormatError(where, "allow_internet must be true or false")
    return TaskEnvironment(
        dockerfile_dir=env_dir if dockerfile.is_file() else None,
        docker_image=_opt_str(table, "docker_image", where),
        compose_file=compose if compose.is_file() else None,
        files_dir=files if files.is_dir() else None,
        setup_script=setup.read_text() if setup.is_file() else None,
        cpus=float(cpus) if cpus is not None else None,
        memory_mb=memory,
        allow_internet=allow,
        allowed_hosts=_host_list(table, where),
        build_timeout_sec=_timeout(table, where, DEFAULT_BUILD_TIMEOUT_SEC, "build_timeout_sec"),
        env=_str_map(table, "env", where),
        prune_git_history=_bool(table, "prune_git_history", where, True),
    )


def _audit(table: dict[str, Any], where: str) -> TaskAudit:
    unknown = sorted(set(table) - {"upstream", "packages", "protected_paths"})
    if unknown:
        raise TaskFormatError(where, f"unknown key(s) {unknown}")
    return TaskAudit(
        upstream=_strings(table, "upstream", where),
        packages=_strings(table, "packages", where),
        protected_paths=_strings(table, "protected_paths", where),
    )


def _strings(table: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise TaskFormatError(where, f"`{key}` must be a list of strings")
    return tuple(value)


def _bool(table: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise TaskFormatError(where, f"`{key}` must be true or false")
    return value


def _host_list(table: dict[str, Any], where: str) -> tuple[str, ...]:
    hosts = table.get("allowed_hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
        raise TaskFormatError(where, "allowed_hosts must be a list of host patterns")
    return tuple(hosts)


def _size_mb(value: Any, where: str) -> int:
    text = str(value).strip().upper() if isinstance(value, str) else ""
    scale = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}.get(text[-1:])
    try:
        mb = int(float(text[:-1]) * scale) if scale else 0
    except ValueError:
        mb = 0
    if mb <= 0:
        raise TaskFormatError(where, f"memory = {value!r}: expected a size like '2G' or '512M'")
    return mb


def _dockerfile_workdir(env_dir: Path) -> str | None:
    """The last literal WORKDIR of environment/Dockerfile: Harbor execs in the image's workdir."""
    dockerfile = env_dir / "Dockerfile"
    if not dockerfile.is_file():
        return None
    found = _WORKDIR_LINE.findall(dockerfile.read_text())
    last = found[-1].strip("\"'") if found else None
    return last if last and last.startswith("/") and "$" not in last else None


def _load_jsonl(path: Path) -> list[Task]:
    path = path.resolve()
    return _parse_jsonl(path.read_text(), path)


def parse_jsonl(text: str, source: Path) -> list[Task]:
    """Tasks in the JSONL shorthand given as text (tasks sent inline to the rollout service);
    `source` names where they came from in errors and on each task."""
    return _unique(_parse_jsonl(text, source), source)


def _parse_jsonl(text: str, path: Path) -> list[Task]:
    tasks = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskFormatError(where, f"not valid JSON: {e.msg}") from e
        if not isinstance(obj, dict):
            raise TaskFormatError(where, "each line must be a JSON object")
        unknown = sorted(set(obj) - _JSONL_KEYS)
        if unknown:
            raise TaskFormatError(where, f"unknown key(s) {unknown}; known: {sorted(_JSONL_KEYS)}")
        tasks.append(_jsonl_task(obj, path, where))
    return tasks


def _jsonl_task(obj: dict[str, Any], path: Path, where: str) -> Task:
    task_id = obj.get("id")
    if not isinstance(task_id, str) or not _ID.match(task_id):
        raise TaskFormatError(where, "`id` must be a string matching [A-Za-z0-9][A-Za-z0-9_.-]*")
    for key in ("instruction", "test"):
        value = obj.get(key)
        if not isinstance(value, str) or not value.strip():
            raise TaskFormatError(where, f"`{key}` must be a non-empty string")
    return Task(
        id=task_id,
        instruction=obj["instruction"],
        source=path,
        workdir=_abs_path(_opt_str(obj, "workdir", where) or DEFAULT_WORKDIR, where),
        environment=TaskEnvironment(
            docker_image=_opt_str(obj, "docker_image", where),
            setup_script=_opt_str(obj, "setup", where) or None,
        ),
        agent_timeout_sec=_timeout(obj, where, DEFAULT_AGENT_TIMEOUT_SEC, "agent_timeout_sec"),
        verifier_timeout_sec=_timeout(
            obj, where, DEFAULT_VERIFIER_TIMEOUT_SEC, "verifier_timeout_sec"
        ),
        verifier_sandbox=_verifier_sandbox(obj, "verifier_sandbox", where),
        test_script=obj["test"],
        reward_from_exit_code=True,
        solution_script=_opt_str(obj, "solution", where),
        entry_hash="sha256:" + hashlib.sha256(_canonical(obj)).hexdigest(),
    )


def _canonical(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _table(config: dict[str, Any], name: str, where: Path) -> dict[str, Any]:
    value = config.get(name, {})
    if not isinstance(value, dict):
        raise TaskFormatError(where, f"[{name}] must be a table")
    return value


def _opt_str(table: dict[str, Any], key: str, where: str) -> str | None:
    value = table.get(key)
    if value is not None and not isinstance(value, str):
        raise TaskFormatError(where, f"`{key}` must be a string")
    return value


def _opt_user(table: dict[str, Any], where: str) -> str | None:
    value = table.get("user")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TaskFormatError(where, "`user` must be a name or a uid")
    return str(value)


def _verifier_sandbox(table: dict[str, Any], key: str, where: str) -> VerifierSandbox:
    value = table.get(key, VerifierSandbox.FRESH.value)
    try:
        return VerifierSandbox(value)
    except ValueError:
        known = " or ".join(f'"{v.value}"' for v in VerifierSandbox)
        raise TaskFormatError(where, f"`{key}` must be {known}, got {value!r}") from None


def _timeout(table: dict[str, Any], where: str, default: float, key: str = "timeout_sec") -> float:
    value = table.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise TaskFormatError(where, f"`{key}` must be a positive number of seconds")
    return float(value)


def _str_map(table: dict[str, Any], key: str, where: str) -> dict[str, str]:
    value = table.get(key, {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise TaskFormatError(where, f"`{key}` must be a table of strings")
    return dict(value)


def _abs_path(value: str, where: str) -> str:
    parts = value.split("/")
    if not value.startswith("/") or "\0" in value or ".." in parts:
        problem = f"workdir must be an absolute path without '..', got {value!r}"
        raise TaskFormatError(where, problem)
    return "/" + "/".join(p for p in parts if p and p != ".")
