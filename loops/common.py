"""What the trainer loops share: their settings, a dataset row's task, the trainer's sampling
parameters as the proxy imposes them, running tasks as one service batch, and the trajectory a
sample hands to a trainer. Imports no trainer."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import orjson

from ..client import DEFAULT_URL, AsyncClient, Batch, Dropped, Group, Sample, Trajectory
from ..proxy.upstream.sampling import IMPOSABLE

__all__ = [
    "RAN_TO_AN_END",
    "TASK_KEY",
    "URL_ENV",
    "LoopError",
    "LoopSettings",
    "TaskRef",
    "final_trajectory",
    "run_tasks",
    "sampling_from",
    "task_from",
    "trajectory_info",
]

TASK_KEY = "rolltap_task"
"""The dataset column (or key of verl's `extra_info`, SkyRL's `env_extras`, slime's
`metadata`) that holds a row's rolltap task."""

URL_ENV = "ROLLTAP_URL"
"""The rollout service's URL when the settings name none."""

TaskRef = dict[str, Any] | str
"""A task object in the JSONL shorthand (id, instruction, test, ...) or a path on the server to
one task directory."""

RAN_TO_AN_END = frozenset({"succeeded", "finished", "timed_out", "budget_exceeded"})
"""Rollout statuses of a harness that ran until it ended or was stopped by a limit, and was
verified ("succeeded" and "finished" name the same status in different rolltap versions)."""

_ALIASES = {"max_new_tokens": "max_tokens"}  # SGLang's (and slime's) name for the call limit


class LoopError(RuntimeError):
    """A row without a task, or a batch that ended without the groups it was asked for."""


def _plain(value: Any) -> Any:
    """Mappings and lists (OmegaConf's, numpy's) as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or type(value).__name__ in ("ListConfig", "ndarray"):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class LoopSettings:
    """Where the service is and what a loop asks of it: every field of `POST /v1/batches` that
    is not about the tasks themselves."""

    url: str = field(default_factory=lambda: os.environ.get(URL_ENV, DEFAULT_URL))
    token: str | None = None
    """The admin token; None: ROLLTAP_ADMIN_TOKEN."""
    harness: str = "mini-swe-agent"
    sandbox: str | None = None
    budgets: dict[str, Any] | None = None
    """max_calls, max_tokens, timeout, max_steps."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """Imposed on every call, over what the trainer asks (a None value drops the trainer's)."""
    labels: dict[str, Any] = field(default_factory=dict)
    concurrency: int | None = None
    retries: int | None = None
    egress: dict[str, Any] | None = None
    task_key: str = TASK_KEY

    @classmethod
    def from_options(cls, options: Mapping[str, Any], prefix: str = "") -> LoopSettings:
        """Settings from a mapping that may hold other things too (a verl agent-loop config
        entry, slime's args as a dict with `prefix="rolltap_"`); keys that are None are left at
        their defaults."""
        chosen = {}
        for f in fields(cls):
            value = options.get(prefix + f.name)
            if value is not None:
                chosen[f.name] = _plain(value)
        return cls(**chosen)

    def client(self) -> AsyncClient:
        return AsyncClient(self.url, token=self.token)


def task_from(row: Mapping[str, Any], key: str = TASK_KEY, *nested: str) -> TaskRef:
    """The rolltap task of a dataset row: `row[key]`, else `row[n][key]` for each of `nested`
    (verl's `extra_info`, slime's `metadata`). A task object may also come as JSON text."""
    places = [row, *(row.get(n) for n in nested)]
    for place in places:
        if isinstance(place, Mapping) and place.get(key) is not None:
            value = _plain(place[key])
            if isinstance(value, str) and value.lstrip().startswith("{"):
                value = orjson.loads(value)
            if isinstance(value, dict | str):
                return value
            raise LoopError(f"{key!r} must be a task object or a path, not {type(value).__name__}")
    where = " or ".join([repr(key)] + [f"{n}[{key!r}]" for n in nested])
    raise LoopError(f"the row has no rolltap task: put one in {where}")


def sampling_from(
    params: Mapping[str, Any] | None, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The trainer's sampling parameters that the proxy imposes on every call (temperature,
    top_p, top_k, min_p, max_tokens, seed, penalties); others (verl's `logprobs`: rolltap always
    records them) are dropped, as is a top_k of 0 or less (vLLM's and SGLang's "off")."""
    out: dict[str, Any] = {}
    for raw_key, value in (params or {}).items():
        key = _ALIASES.get(raw_key, raw_key)
        if key not in IMPOSABLE or isinstance(value, bool):
            continue
        value = _plain(value)
        if hasattr(value, "item"):  # a numpy scalar
            value = value.item()
        if not isinstance(value, int | float) or (key == "top_k" and value <= 0):
            continue
        out[key] = value
    for key, value in (overrides or {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def final_trajectory(sample: Sample) -> Trajectory | None:
    """The trajectory a trainer gets for a sample: its last main-line segment, which holds the
    answers that reached the outcome the reward judges (else its last segment of any role);
    None when the rollout made no call that yielded one."""
    main = [t for t in sample.trajectories if t.role == "main"] or sample.trajectories
    return max(main, key=lambda t: t.segment, default=None)


def trajectory_info(group: Group, sample: Sample, t: Trajectory | None) -> dict[str, Any]:
    """What rolltap knows about a sample beyond the arrays, for a trainer's extra fields."""
    info: dict[str, Any] = {
        "batch_id": group.batch_id,
        "task_id": group.task_id,
        "rollout_id": sample.rollout_id,
        "sample_index": sample.sample_index,
        "status": sample.status,
        "error": sample.error,
        "segments": len(sample.trajectories),
        "faithfulness": sample.faithfulness,
        "staleness": sample.staleness,
    }
    if t is not None:
        info |= {
            "segment": t.segment,
            "finish_reason": t.finish_reason,
            "weight_versions": list(t.weight_versions),
            "min_version": t.min_version,
            "max_version": t.max_version,
            "turns": [
                {"kind": turn.kind, "start": turn.start, "end": turn.end, "hash": turn.token_hash}
                for turn in t.turns
            ],
        }
    return info


async def run_tasks(
    client: AsyncClient,
    tasks: Sequence[TaskRef],
    samples_per_task: int,
    settings: LoopSettings,
    *,
    sampling: Mapping[str, Any] | None = None,
    policy_version: str | None = None,
    labels: Mapping[str, Any] | None = None,
) -> list[Group]:
    """Run every task `samples_per_task` times on the service and return one complete group per
    task, in the order of `tasks`. Task objects go as one batch, each path as a batch of its
    own (a path must hold one task). If the caller is cancelled, so are the batches."""
    body = {
        "harness": settings.harness,
        "samples_per_task": samples_per_task,
        "sandbox": settings.sandbox,
        "budgets": settings.budgets,
        "sampling": sampling_from(sampling, settings.sampling) or None,
        "labels": {**settings.labels, **(labels or {})} or None,
        "policy_version": policy_version,
        "concurrency": settings.concurrency,
        "retries": settings.retries,
        "egress": settings.egress,
    }
    inline = {i: t for i, t in enumerate(tasks) if isinstance(t, dict)}
    jobs: list[tuple[list[int], list[dict[str, Any]] | str]] = [
        ([i], t) for i, t in enumerate(tasks) if isinstance(t, str)
    ]
    if inline:
        jobs.insert(0, (list(inline), list(inline.values())))
    results = await asyncio.gather(*(_run_batch(client, what, body) for _, what in jobs))
    ordered: list[Group | None] = [None] * len(tasks)
    for (indexes, what), groups in zip(jobs, results, strict=True):
        if isinstance(what, str):
            if len(groups) != 1:
                raise LoopError(f"task path {what} held {len(groups)} tasks; a row names one")
            ordered[indexes[0]] = next(iter(groups.values()))
            continue
        for i in indexes:
            ordered[i] = groups.get(str(inline[i].get("id")))
    missing = [tasks[i] for i, g in enumerate(ordered) if g is None]
    if missing:
        raise LoopError(f"the service returned no group for {len(missing)} task(s): {missing[:3]}")
    return [g for g in ordered if g is not None]


async def _run_batch(
    client: AsyncClient, tasks: list[dict[str, Any]] | str, body: Mapping[str, Any]
) -> dict[str, Group]:
    batch = await client.submit(tasks, **body)
    groups: dict[str, Group] = {}
    ended: Batch | None = None
    try:
        async for event in client.events(batch.id):
            if isinstance(event, Group):
                groups[event.task_id] = event
            elif isinstance(event, Dropped):
                raise LoopError(f"batch {batch.id} dropped the group of {event.task_id}")
            else:
                ended = event
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.shield(client.cancel(batch.id))
        raise
    if ended is not None and ended.status != "done":
        error = ended.data.get("error") or ended.status
        raise LoopError(f"batch {batch.id} ended {ended.status}: {error}")
    return groups
