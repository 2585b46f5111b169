"""What a trainer asks for in `POST /v1/batches`, checked field by field into a typed spec.

    {"id": "step-12",                       # optional: the batch id (a retry returns this batch)
     "tasks": "/data/tasks" | [{...}, ...] | "<JSONL text>",
     "harness": "mini-swe-agent", "sandbox": "bwrap", "samples_per_task": 8,
     "budgets": {"max_calls": 100, "max_tokens": null, "timeout": 600, "max_steps": null},
     "labels": {"step": 12}, "policy_version": "12",
     "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 2048, ...},
     "keep": "all" | "informative", "target_groups": 64,
     "max_staleness": 1, "stale": "drop" | "flag" | "relaunch", "max_relaunches": 2,
     "on_hack": "flag" | "zero_reward" | "drop",   # a sample the hack detectors flagged
     "concurrency": 16, "pools": {"init": 16, "run": 16, "eval": 16}, "retries": 2,
     "egress": {"mode": "none" | "allowlist" | "intercept", "allow": ["pypi.org"]},
     "capture_routed_experts": false}       # MoE routing replay (R3) with every call's tokens

Tasks come as a path the server can read (a Harbor task directory, a directory of them, or a
JSONL file; confined to the server's tasks root when it has one) or inline in the JSONL
shorthand (a list of objects, or JSONL text).
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from ...proxy.staleness import StalePolicy
from ...proxy.upstream.sampling import IMPOSABLE
from ..egress.rules import valid_pattern
from ..egress.settings import EgressMode
from ..tasks import Task, TaskFormatError, load_tasks, parse_jsonl

BATCH_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_FIELDS = {
    "id",
    "tasks",
    "harness",
    "sandbox",
    "samples_per_task",
    "budgets",
    "labels",
    "policy_version",
    "sampling",
    "keep",
    "target_groups",
    "max_staleness",
    "stale",
    "max_relaunches",
    "on_hack",
    "concurrency",
    "pools",
    "retries",
    "egress",
    "capture_routed_experts",
}
_BUDGETS = {"max_calls", "max_tokens", "timeout", "max_steps"}
E = TypeVar("E", bound=enum.StrEnum)
MAX_TASKS = 100_000
MAX_SAMPLES = 1024


class SpecError(ValueError):
    """A request body that cannot become a batch; `param` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class OnHack(enum.StrEnum):
    """What a group does with a sample the reward-hack detectors flagged (analysis/hacks.py)."""

    FLAG = "flag"
    """Deliver it as it is, its flags on the sample."""
    ZERO_REWARD = "zero_reward"
    """Deliver it with reward 0 (the group judged on that)."""
    DROP = "drop"
    """Drop its whole group (a group is compared within itself)."""


class Keep(enum.StrEnum):
    ALL = "all"
    """Deliver every complete group."""
    INFORMATIVE = "informative"
    """Drop groups whose rewards are all equal (no learning signal for GRPO/DAPO)."""


@dataclass(frozen=True)
class Budgets:
    max_calls: int | None = 100
    max_tokens: int | None = None
    timeout: float | None = None
    """The harness's wall clock per rollout; None: the task's own."""
    max_steps: int | None = None


@dataclass(frozen=True)
class PoolSizes:
    """Rollouts of the batch in each stage at once (INIT: sandbox + setup, RUN: the harness,
    EVAL: the verifier); the service's own pools bound all batches together."""

    init: int
    run: int
    eval: int


@dataclass(frozen=True)
class ServiceLimits:
    """What the server allows a batch to ask for."""

    sandboxes: tuple[str, ...] = ("bwrap", "docker", "apptainer")
    default_sandbox: str = "bwrap"
    tasks_root: Path | None = None
    """When set, task paths must lie under it."""
    max_concurrency: int = 64
    routed_experts_refusal: str | None = None
    """Why this server's engines cannot give routed experts (proxy/upstream/routed.py); None: they
    can,
    or it cannot tell (the proxy refuses each call then)."""


@dataclass(frozen=True)
class BatchSpec:
    tasks: tuple[Task, ...]
    tasks_source: str
    harness: str
    sandbox: str
    samples_per_task: int = 1
    budgets: Budgets = field(default_factory=Budgets)
    labels: Mapping[str, Any] = field(default_factory=dict)
    policy_version: str | None = None
    sampling: Mapping[str, float | int] = field(default_factory=dict)
    keep: Keep = Keep.ALL
    target_groups: int | None = None
    max_staleness: int | None = None
    stale: StalePolicy = StalePolicy.DROP
    max_relaunches: int = 2
    """`stale: "relaunch"` runs a sample again at most this often; a sample stopped once more
    is kept as it ended (cancelled, marked stale), so a trainer updating faster than a rollout
    can finish within the bound does not relaunch it for ever."""
    on_hack: OnHack = OnHack.FLAG
    concurrency: int = 8
    pools: PoolSizes | None = None
    retries: int = 2
    egress: EgressMode = EgressMode.NONE
    """docs/egress.md; the server's egress config supplies the rest (`--egress-config`)."""
    egress_allow: tuple[str, ...] = ()
    """Host patterns added to the server's allow-list for this batch's tasks."""
    capture_routed_experts: bool = False
    """Record each call's routed experts (proxy/upstream/routed.py): every rollout asks for them."""
    id: str | None = None
    fingerprint: str = ""
    """A hash of the request body: a retry with the same id must ask for the same batch."""


def parse_spec(body: Mapping[str, Any], limits: ServiceLimits) -> BatchSpec:
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise SpecError(f"unknown field(s) {unknown}; known: {sorted(_FIELDS)}", unknown[0])
    batch_id = _opt(body, "id", str)
    if batch_id is not None and not BATCH_ID.match(batch_id):
        raise SpecError("'id' must match [A-Za-z0-9][A-Za-z0-9_.:-]{0,127}", "id")
    harness = _opt(body, "harness", str)
    if not harness:
        raise SpecError("'harness' names the harness to run (e.g. mini-swe-agent)", "harness")
    sandbox = _opt(body, "sandbox", str) or limits.default_sandbox
    if sandbox not in limits.sandboxes:
        allowed = ", ".join(limits.sandboxes)
        raise SpecError(f"sandbox {sandbox!r} is not allowed here; use one of {allowed}", "sandbox")
    tasks, source = _tasks(body.get("tasks"), limits)
    samples = _count(body, "samples_per_task", 1, MAX_SAMPLES) or 1
    keep = _enum(body, "keep", Keep, Keep.ALL)
    target = _count(body, "target_groups", 1, MAX_TASKS)
    concurrency = _count(body, "concurrency", 1, limits.max_concurrency) or min(
        8, limits.max_concurrency
    )
    egress, egress_allow = _egress(body.get("egress"))
    routed_experts = _flag(body, "capture_routed_experts")
    if routed_experts and limits.routed_experts_refusal is not None:
        raise SpecError(limits.routed_experts_refusal, "capture_routed_experts")
    return BatchSpec(
        tasks=tuple(tasks),
        tasks_source=source,
        harness=harness,
        sandbox=sandbox,
        samples_per_task=samples,
        budgets=_budgets(body.get("budgets")),
        labels=_mapping(body, "labels"),
        policy_version=_version(body.get("policy_version")),
        sampling=parse_sampling(body.get("sampling")),
        keep=keep,
        target_groups=target,
        max_staleness=_count(body, "max_staleness", 0, 1_000_000),
        stale=_enum(body, "stale", StalePolicy, StalePolicy.DROP),
        max_relaunches=_count(body, "max_relaunches", 0, 100) or 0
        if body.get("max_relaunches") is not None
        else BatchSpec.max_relaunches,
        on_hack=_enum(body, "on_hack", OnHack, OnHack.FLAG),
        concurrency=concurrency,
        pools=_pools(body.get("pools"), limits),
        retries=2 if body.get("retries") is None else _count(body, "retries", 0, 10) or 0,
        egress=egress,
        egress_allow=egress_allow,
        capture_routed_experts=routed_experts,
        id=batch_id,
        fingerprint=fingerprint(body),
    )


def fingerprint(body: Mapping[str, Any]) -> str:
    """The request body's hash, key order aside."""
    canonical = orjson.dumps(dict(body), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()[:32]


def _tasks(value: object, limits: ServiceLimits) -> tuple[list[Task], str]:
    try:
        if isinstance(value, str) and "\n" not in value and not value.lstrip().startswith("{"):
            path = _confined(Path(value), limits.tasks_root)
            tasks, source = load_tasks(path), str(path)
        elif isinstance(value, str):
            tasks, source = parse_jsonl(value, Path("<inline>")), "inline"
        elif isinstance(value, list) and value and all(isinstance(t, dict) for t in value):
            text = "\n".join(orjson.dumps(t).decode() for t in value)
            tasks, source = parse_jsonl(text, Path("<inline>")), "inline"
        else:
            raise SpecError(
                "'tasks' must be a path the server can read, JSONL text, or a list of task objects",
                "tasks",
            )
    except TaskFormatError as e:
        raise SpecError(f"tasks: {e}", "tasks") from None
    if not tasks:
        raise SpecError("'tasks' holds no task", "tasks")
    if len(tasks) > MAX_TASKS:
        raise SpecError(f"at most {MAX_TASKS} tasks per batch", "tasks")
    return tasks, source


def _confined(path: Path, root: Path | None) -> Path:
    if not path.is_absolute():
        raise SpecError("a task path must be absolute (it is read on the server)", "tasks")
    resolved = path.resolve()
    if root is not None and not resolved.is_relative_to(root.resolve()):
        raise SpecError(f"task paths must lie under the server's tasks root {root}", "tasks")
    return resolved


def _budgets(value: object) -> Budgets:
    if value is None:
        return Budgets()
    if not isinstance(value, dict):
        raise SpecError("'budgets' must be an object", "budgets")
    unknown = sorted(set(value) - _BUDGETS)
    if unknown:
        raise SpecError(f"unknown budget(s) {unknown}; known: {sorted(_BUDGETS)}", "budgets")
    timeout = value.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise SpecError("'budgets.timeout' must be a positive number of seconds", "budgets")
    defaults = Budgets()
    return Budgets(
        max_calls=_count(value, "max_calls", 1, 1_000_000)
        if "max_calls" in value
        else defaults.max_calls,
        max_tokens=_count(value, "max_tokens", 1, 2**31 - 1),
        timeout=None if timeout is None else float(timeout),
        max_steps=_count(value, "max_steps", 1, 1_000_000),
    )


def parse_sampling(value: object) -> dict[str, float | int]:
    """A batch's `sampling` checked against what the proxy can impose (SpecError if not)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError("'sampling' must be an object", "sampling")
    out: dict[str, float | int] = {}
    for key, raw in value.items():
        kind = IMPOSABLE.get(key)
        if kind is None:
            raise SpecError(
                f"sampling option {key!r} is not supported; use {sorted(IMPOSABLE)}",
                "sampling",
            )
        if raw is None:
            continue
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise SpecError(f"'sampling.{key}' must be a number", "sampling")
        if kind is int and not float(raw).is_integer():
            raise SpecError(f"'sampling.{key}' must be an integer", "sampling")
        out[key] = int(raw) if kind is int else float(raw)
    if out.get("max_tokens", 1) < 1 or out.get("temperature", 0.0) < 0:
        raise SpecError("'sampling' has a negative temperature or max_tokens < 1", "sampling")
    return out


def _pools(value: object, limits: ServiceLimits) -> PoolSizes | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"init", "run", "eval"}:
        raise SpecError("'pools' must be an object with init, run and eval sizes", "pools")
    cap = limits.max_concurrency
    sizes = {k: _count(value, k, 1, cap) for k in ("init", "run", "eval")}
    return PoolSizes(sizes["init"] or cap, sizes["run"] or cap, sizes["eval"] or cap)


def _version(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise SpecError("'policy_version' must be a string", "policy_version")
    return str(value)


def _mapping(body: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"'{key}' must be an object", key)
    return dict(value)


def _opt(body: Mapping[str, Any], key: str, kind: type[str]) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, kind):
        raise SpecError(f"'{key}' must be a {kind.__name__}", key)
    return value


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise SpecError(f"'{key}' must be true or false", key)
    return bool(value)


def _count(body: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SpecError(f"'{key}' must be an integer from {low} to {high}", key)
    return value


def _egress(value: object) -> tuple[EgressMode, tuple[str, ...]]:
    if value is None:
        return EgressMode.NONE, ()
    if not isinstance(value, dict) or set(value) - {"mode", "allow"}:
        raise SpecError('\'egress\' is {"mode": ..., "allow": [host patterns]}', "egress")
    try:
        mode = EgressMode(value.get("mode", "none"))
    except ValueError:
        raise SpecError(
            "'egress.mode' must be one of none, allowlist, intercept", "egress"
        ) from None
    allow = value.get("allow") or []
    if not isinstance(allow, list) or not all(
        isinstance(p, str) and valid_pattern(p) for p in allow
    ):
        raise SpecError(
            "'egress.allow' must be a list of host patterns (pypi.org, *.example.org)", "egress"
        )
    return mode, tuple(allow)


def _enum(body: Mapping[str, Any], key: str, kind: type[E], default: E) -> E:
    value = body.get(key)
    if value is None:
        return default
    try:
        return kind(value)
    except ValueError:
        raise SpecError(f"'{key}' must be one of {', '.join(kind)}", key) from None


def describe(spec: BatchSpec) -> dict[str, Any]:
    """The spec as the batch's JSON shows it (tasks by count and source)."""
    return {
        "tasks": {"source": spec.tasks_source, "count": len(spec.tasks)},
        "harness": spec.harness,
        "sandbox": spec.sandbox,
        "samples_per_task": spec.samples_per_task,
        "budgets": {
            "max_calls": spec.budgets.max_calls,
            "max_tokens": spec.budgets.max_tokens,
            "timeout": spec.budgets.timeout,
            "max_steps": spec.budgets.max_steps,
        },
        "labels": dict(spec.labels),
        "policy_version": spec.policy_version,
        "sampling": dict(spec.sampling),
        "keep": spec.keep.value,
        "target_groups": spec.target_groups,
        "max_staleness": spec.max_staleness,
        "stale": spec.stale.value,
        "max_relaunches": spec.max_relaunches,
        "on_hack": spec.on_hack.value,
        "concurrency": spec.concurrency,
        "pools": None
        if spec.pools is None
        else {"init": spec.pools.init, "run": spec.pools.run, "eval": spec.pools.eval},
        "retries": spec.retries,
        "egress": {"mode": spec.egress.value, "allow": list(spec.egress_allow)},
        "capture_routed_experts": spec.capture_routed_experts,
    }
