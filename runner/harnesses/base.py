"""The seam between the runner and an agent harness: what to install, what to run, how it ended.

An adapter only describes: `launch()` says *what* to run (argv, env, files to write, where the
harness keeps its own logs); the pipeline decides *where* (plain process, bwrap, docker). Every
path in a `RunContext`, a `Launch` or an `Installation` is a path as seen inside the sandbox, and
installations live at the same path on the host and in the sandbox.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol

if TYPE_CHECKING:
    from ..tasks import Task

Dialect = Literal["chat", "responses", "messages"]
"""The LLM API a harness speaks: Chat Completions, OpenAI Responses or Anthropic Messages."""

STANDARD_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


@dataclass(frozen=True)
class PythonPackages:
    """Installed with pip into a venv at `<prefix>/venv`."""

    requirements: tuple[str, ...]
    python: tuple[int, int] = (3, 10)
    """Oldest Python minor version the harness runs on."""
    python_below: tuple[int, int] | None = None
    """First Python minor version the harness no longer runs on."""

    bin_dir: ClassVar[str] = "venv/bin"


@dataclass(frozen=True)
class NpmPackages:
    """Installed with `npm install --prefix <prefix>`."""

    requirements: tuple[str, ...]

    bin_dir: ClassVar[str] = "node_modules/.bin"


@dataclass(frozen=True)
class BuiltIn:
    """Nothing to install: the harness is part of rolltap (the oracle). Its installation mounts
    nothing into the sandbox and it never comes from a harness image."""

    requirements: tuple[str, ...] = ()

    bin_dir: ClassVar[str] = ""


Packages = PythonPackages | NpmPackages | BuiltIn


@dataclass(frozen=True)
class Installation:
    """A harness installed at `prefix`, the same path on the host and in the sandbox."""

    name: str
    prefix: PurePosixPath
    bin_dir: PurePosixPath
    mounts: tuple[PurePosixPath, ...] = ()
    """Host paths a sandbox must show read-only at the same path for the harness to run: the
    prefix itself and whatever outside it the harness needs (the interpreter a venv points to,
    node when it is not under /usr). Empty when the harness is baked into an image."""
    path: tuple[str, ...] = ()
    """Directories the harness needs on PATH (node's, when it is not a standard one)."""

    def search_path(self) -> str:
        # The harness's own bin directory stays off PATH: agents run the model's commands with
        # this environment, and `python` must be the task's, not the harness venv's.
        dirs = [*self.path, *(d for d in STANDARD_PATH if d not in self.path)]
        return ":".join(dirs)


@dataclass(frozen=True)
class RunContext:
    """One rollout, as the sandbox sees it."""

    instruction: str
    rollout_url: str = field(repr=False)
    """The proxy's root for this rollout, without `/v1`: `http://127.0.0.1:8000/r/<key>`. It holds
    the key, so it is as secret as the key."""
    key: str = field(repr=False)
    """The rollout key, given to the harness as its API key. A secret: never on a command line."""
    model: str
    """The served model name the harness must ask for."""
    workdir: PurePosixPath
    home: PurePosixPath
    """A writable HOME for the harness's own state."""
    logs_dir: PurePosixPath = field(default_factory=lambda: PurePosixPath("/logs/agent"))
    max_steps: int | None = None
    """Turn/step cap, where the harness has one (OpenCode and OpenHands' CLI have none)."""
    task: Task | None = None
    """The task itself, for a harness that reads more of it than the instruction (the oracle
    runs its reference solution)."""

    @property
    def openai_base_url(self) -> str:
        return self.rollout_url.rstrip("/") + "/v1"


@dataclass(frozen=True)
class Launch:
    """How to start the harness: run `argv` in `cwd` with exactly `env`, stdin from /dev/null,
    after writing `files`; save stdout to `stdout_path`."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)
    """The complete environment (not merged with the runner's); holds the key."""
    cwd: PurePosixPath
    files: Mapping[PurePosixPath, str] = field(default_factory=dict, repr=False)
    copies: Mapping[PurePosixPath, Path] = field(default_factory=dict)
    """Host files or directories copied in before the harness starts (inside path: host path)."""
    stdout_path: PurePosixPath | None = None
    """Where the harness's stdout belongs (an event stream for most of them)."""
    logs: tuple[PurePosixPath, ...] = ()
    """Files and directories the harness writes its own logs and trajectories into; keep them
    with the rollout."""


class Ending(enum.StrEnum):
    FINISHED = "finished"
    """The harness ended the episode on its own."""
    LIMIT = "limit"
    """A step, turn or budget limit stopped it."""
    PROTOCOL_ERROR = "protocol_error"
    """It gave up on an LLM call: an HTTP error, a malformed response, a dropped stream."""
    FAILED = "failed"
    """Anything else: a crash, a non-zero exit with no reason given, a kill."""


@dataclass(frozen=True)
class Outcome:
    ending: Ending
    detail: str = ""
    """A short reason in the harness's words, with the rollout key removed."""


@dataclass(frozen=True)
class HarnessExit:
    """What the pipeline saw when the harness stopped."""

    returncode: int | None
    """None when the runner killed it."""
    stdout: str = ""
    stderr: str = ""
    files: Mapping[PurePosixPath, bytes] = field(default_factory=dict)
    """Contents of the log files named in `Launch.logs` (files only), where they exist."""


class Harness(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def dialect(self) -> Dialect: ...

    @property
    def packages(self) -> Packages:
        """What `rolltap harness install` puts in the prefix (pinned versions)."""
        ...

    def launch(self, ctx: RunContext, installation: Installation) -> Launch: ...

    def classify(self, ctx: RunContext, exit: HarnessExit) -> Outcome: ...


def base_env(ctx: RunContext, installation: Installation) -> dict[str, str]:
    """What every harness's environment starts from; Launch.env is complete, not merged."""
    return {"PATH": installation.search_path(), "HOME": str(ctx.home), "LANG": "C.UTF-8"}


def redact(text: str, ctx: RunContext, limit: int = 500) -> str:
    """`text` shortened to `limit` characters with the rollout key masked."""
    clean = text.replace(ctx.key, "<key>") if ctx.key else text
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."


def exit_outcome(ctx: RunContext, exit: HarnessExit) -> Outcome:
    """The fallback when a harness's own output says nothing: judge by the exit status."""
    if exit.returncode == 0:
        return Outcome(Ending.FINISHED)
    if exit.returncode is None:
        return Outcome(Ending.FAILED, "killed by the runner")
    tail = exit.stderr.strip().splitlines()[-1:] or [""]
    return Outcome(Ending.FAILED, redact(f"exit {exit.returncode}: {tail[0]}", ctx))
