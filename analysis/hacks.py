"""Reward hacking, detected from the record: detectors read what a rollout's agent did (its tool
calls and the results the harness sent back, in every dialect; its egress requests; its timing)
and flag what earns reward without solving the task.

A detector is anything with a `name` and `check(record) -> list[HackFlag]` (the `Detector`
Protocol); each flag names the call and the command that raised it (`HackFlag`, the record the
rollout row holds: store/flags.py, named from here too). The built-ins live in
analysis/detectors.py; which ones run is chosen by analysis/choice.py (`load_detectors`). A user
adds their own for a task family by name, in either of two ways:

- a dotted path `package.module:attr` given to `rolltap run --detector` / `rolltap audit hacks
  --detector` (or `ROLLTAP_DETECTORS`, comma-separated), where `attr` is a detector, a class of
  them (made with no arguments) or a function returning one or a list;
- an entry point in the group `rolltap.detectors` of an installed package, loaded the same way
  and used with the built-ins by default.

What a detector may rely on besides the calls and egress: `record.facts`, what the runner
learned about the task when it provisioned the workspace (rollout meta["audit"]: the workdir,
the verifier's paths, the task's upstream and packages, and the git history beyond the base
commit, runner/guard.py).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sqlalchemy import select
from sqlalchemy.engine import Connection

from ..store import compress, egress, queries
from ..store.flags import HackFlag as HackFlag
from ..store.flags import flags_of as flags_of
from ..store.models import CallDialect, CallStatus, call_body_table, call_table
from ..store.records import RolloutView
from .actions import Action, RecordedCall, read_actions

if TYPE_CHECKING:
    from ..store.store import Store

log = logging.getLogger("rolltap.analysis.hacks")

AUDIT_META = "audit"
"""The rollout meta key the runner records the task's facts under (runner/guard.py)."""
COMMAND_LIMIT = 300
"""Characters of a flag's command kept (the call itself holds the rest)."""
FLAGS_PER_DETECTOR = 20


@dataclass(frozen=True)
class GitFacts:
    head: str | None
    branch: str | None
    hidden: tuple[str, ...] = ()
    """Commits (full ids) the base commit cannot reach that the workspace held at provisioning
    (other branches, tags, reflogs, stashes, unreachable objects), capped (runner/guard.py)."""
    hidden_refs: tuple[str, ...] = ()
    """Refs other than HEAD's branch it held (refs/tags/v1.1, refs/remotes/origin/main...)."""
    remotes: tuple[str, ...] = ()
    """Remote URLs it held."""
    pruned: bool = False
    """Whether they were removed before the agent started."""


@dataclass(frozen=True)
class TaskFacts:
    workdir: str | None = None
    protected: tuple[str, ...] = ("/tests", "/logs/verifier")
    """Absolute paths (or globs) of the verifier's files: its tests and reward files."""
    upstream: tuple[str, ...] = ()
    """Where the task's code comes from: `host` or `host/path` prefixes (github.com/acme/x)."""
    packages: tuple[str, ...] = ()
    """The code under test, as a package index names it."""
    agent_timeout: float | None = None
    run_seconds: float | None = None
    """How long the harness ran (None before the runner recorded it)."""
    git: GitFacts | None = None

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> TaskFacts:
        data = meta.get(AUDIT_META)
        seconds = meta.get("seconds")
        run = seconds.get("run") if isinstance(seconds, dict) else None
        if not isinstance(data, dict):
            return cls(run_seconds=_float(run))
        git = data.get("git")
        return cls(
            workdir=_str(data.get("workdir")),
            protected=_strs(data.get("protected")) or cls.protected,
            upstream=_strs(data.get("upstream")),
            packages=_strs(data.get("packages")),
            agent_timeout=_float(data.get("agent_timeout")),
            run_seconds=_float(run),
            git=None
            if not isinstance(git, dict)
            else GitFacts(
                head=_str(git.get("head")),
                branch=_str(git.get("branch")),
                hidden=_strs(git.get("hidden")),
                hidden_refs=_strs(git.get("hidden_refs")),
                remotes=_strs(git.get("remotes")),
                pruned=bool(git.get("pruned")),
            ),
        )


@dataclass(frozen=True)
class RolloutRecord:
    """What detectors read: the rollout, its calls (bodies included), its egress requests."""

    rollout: RolloutView
    calls: tuple[RecordedCall, ...] = ()
    egress: tuple[egress.EgressRecord, ...] = ()
    facts_override: TaskFacts | None = field(default=None, compare=False)

    @functools.cached_property
    def actions(self) -> tuple[Action, ...]:
        """Every distinct action of the agent (analysis/actions.py), in the order first seen."""
        return tuple(read_actions(self.calls))

    @functools.cached_property
    def facts(self) -> TaskFacts:
        return self.facts_override or TaskFacts.of(self.rollout.meta)

    def call(self, call_id: str | None) -> RecordedCall | None:
        return next((c for c in self.calls if c.id == call_id), None)


@runtime_checkable
class Detector(Protocol):
    @property
    def name(self) -> str:
        """Short, stable, snake_case: it labels flags, metrics and filters."""
        ...

    def check(self, record: RolloutRecord) -> list[HackFlag]: ...


def detect(record: RolloutRecord, detectors: Iterable[Detector]) -> list[HackFlag]:
    """Every flag the detectors raise, in detector order, each command cut to COMMAND_LIMIT."""
    flags: list[HackFlag] = []
    for detector in detectors:
        try:
            raised = detector.check(record)
        except Exception:  # one broken plugin must not cost a rollout its record
            log.exception("detector %s failed on rollout %s", detector.name, record.rollout.id)
            continue
        for flag in raised[:FLAGS_PER_DETECTOR]:
            command = flag.command
            if command is not None and len(command) > COMMAND_LIMIT:
                command = command[: COMMAND_LIMIT - 1] + "…"
            flags.append(replace(flag, detector=detector.name, command=command))
    return flags


def detectors_of(stored: Any) -> tuple[str, ...] | None:
    """The detectors that flagged a rollout, sorted (None: never checked; (): clean)."""
    flags = flags_of(stored)
    return None if flags is None else tuple(sorted({f.detector for f in flags}))


def by_call(stored: Any) -> dict[str, list[dict[str, Any]]]:
    """A rollout's stored flags grouped by the call each names."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for flag in flags_of(stored) or []:
        if flag.call_id is not None:
            grouped.setdefault(flag.call_id, []).append(flag.as_dict())
    return grouped


def load_record(conn: Connection, rollout_id: str) -> RolloutRecord:
    """A rollout's record as detectors read it, from one snapshot (a `db.read` function)."""
    C, B = call_table, call_body_table
    view = queries.rollout(conn, rollout_id)
    rows = conn.execute(
        select(
            C.c.id,
            C.c.seq,
            C.c.dialect,
            C.c.status,
            C.c.received_at,
            C.c.finished_at,
            B.c.request,
            B.c.response,
        )
        .outerjoin(B, B.c.call_id == C.c.id)
        .where(C.c.rollout_id == rollout_id)
        .order_by(C.c.seq)
    )
    calls = tuple(
        RecordedCall(
            id=row.id,
            seq=row.seq,
            dialect=CallDialect(row.dialect),
            status=CallStatus(row.status),
            received_at=row.received_at,
            finished_at=row.finished_at,
            request=compress.inflate(row.request),
            response=compress.inflate(row.response),
        )
        for row in rows
    )
    return RolloutRecord(view, calls, tuple(egress.records_of(conn, rollout_id)))


async def hack_record(store: Store, rollout_id: str) -> RolloutRecord:
    """What the reward-hack detectors read of a rollout: its calls with their bodies, its
    egress requests, its meta."""
    return await store.db.read(load_record, rollout_id)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _strs(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(v for v in value if isinstance(v, str) and v)


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


Factory = Callable[[], Detector]
