"""Complete groups (every sample of one task): kept or dropped, and their messages to trainers.

A group is informative when its rewards are not all equal (GRPO's advantages are zero
otherwise); a sample without a reward (its verifier never ran) counts as 0 there and is shown
with reward null. A sample is stale when its oldest call is more than `max_staleness` weight
updates old, now or when the proxy checked it at a dispatch (proxy/staleness.py:
meta["stale"]);
`stale: "drop"` drops its whole group (a group must be compared within itself), `"flag"` and
`"relaunch"` keep it with the samples marked. A relaunched sample is its new attempt, judged on
its own calls: the attempt the proxy stopped is not in the group. A sample the reward-hack
detectors flagged (its rollout's hack_flags) is delivered with its flags (`on_hack: "flag"`),
with reward 0 (`"zero_reward"`, the group judged on that), or drops its group (`"drop"`).
"""

from __future__ import annotations

import base64
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rolltap import wire

from ...analysis.reading import build_trajectories
from ...analysis.steps import version_range
from ...analysis.trajectory import RolloutTrajectories, Trajectory
from ...proxy.staleness import StalePolicy, stale_mark
from ...store import RolloutView, Store
from ..plan import RELAUNCH_OF
from .clock import VersionClock
from .spec import BatchSpec, Keep, OnHack

DROPPED_UNINFORMATIVE = "uninformative"
DROPPED_STALE = "stale"
DROPPED_HACKED = "hacked"


@dataclass(frozen=True)
class GroupRecord:
    """What the batch remembers of a complete group; its message is built from the store."""

    seq: int
    """Position among the batch's complete groups, from 1."""
    task_id: str
    rollout_ids: tuple[str, ...]
    """The current attempt of every sample, by sample index."""
    rewards: tuple[float | None, ...]
    informative: bool
    staleness: tuple[int | None, ...]
    """Weight updates since each sample's oldest call (None: it made no call)."""
    stale: tuple[bool, ...]
    kept: bool
    reason: str | None
    """Why it was dropped: uninformative, stale or hacked."""
    hacked: tuple[bool, ...] = ()
    """Whether the reward-hack detectors flagged each sample."""


def judge(
    seq: int,
    task_id: str,
    built: Sequence[RolloutTrajectories],
    spec: BatchSpec,
    clock: VersionClock,
) -> GroupRecord:
    hacked = tuple(bool(b.rollout.hack_flags) for b in built)
    rewards = tuple(b.rollout.reward for b in built)
    if spec.on_hack is OnHack.ZERO_REWARD:
        rewards = tuple(0.0 if h else r for r, h in zip(rewards, hacked, strict=True))
    informative = len({0.0 if r is None else r for r in rewards}) > 1
    staleness = tuple(_staleness(b, clock) for b in built)
    limit = spec.max_staleness
    stale = tuple(
        (limit is not None and s is not None and s > limit) or _marked(b)
        for b, s in zip(built, staleness, strict=True)
    )
    reason = None
    if spec.keep is Keep.INFORMATIVE and not informative:
        reason = DROPPED_UNINFORMATIVE
    elif any(stale) and spec.stale is StalePolicy.DROP:
        reason = DROPPED_STALE
    elif any(hacked) and spec.on_hack is OnHack.DROP:
        reason = DROPPED_HACKED
    return GroupRecord(
        seq=seq,
        task_id=task_id,
        rollout_ids=tuple(b.rollout.id for b in built),
        rewards=rewards,
        informative=informative,
        staleness=staleness,
        stale=stale,
        kept=reason is None,
        reason=reason,
        hacked=hacked,
    )


def _staleness(built: RolloutTrajectories, clock: VersionClock) -> int | None:
    versions = [v for t in built.trajectories for v in t.weight_versions]
    oldest, _ = version_range(versions)
    if oldest is None:
        return None
    return clock.staleness(oldest)


def _marked(built: RolloutTrajectories) -> bool:
    """The proxy found the sample past the bound when one of its calls was dispatched."""
    return stale_mark(built.rollout.meta) is not None


def dropped_message(batch_id: str, record: GroupRecord) -> dict[str, Any]:
    return {
        "batch_id": batch_id,
        "group_id": f"{batch_id}/{record.task_id}",
        "seq": record.seq,
        "task_id": record.task_id,
        "reason": record.reason,
        "rewards": list(record.rewards),
        "rollout_ids": list(record.rollout_ids),
    }


class RecentGroups:
    """The trajectories of the last groups judged, so their first delivery (a trainer reading
    the event stream as groups complete) does not assemble them from the store again. Finished
    rollouts never change, so what is kept here is what the store would give."""

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._built: OrderedDict[int, list[RolloutTrajectories]] = OrderedDict()

    def keep(self, seq: int, built: list[RolloutTrajectories]) -> None:
        self._built[seq] = built
        while len(self._built) > self._size:
            self._built.popitem(last=False)

    def get(self, seq: int) -> list[RolloutTrajectories] | None:
        return self._built.get(seq)


async def group_message(
    store: Store,
    batch_id: str,
    spec: BatchSpec,
    record: GroupRecord,
    encoding: str,
    recent: RecentGroups | None = None,
) -> dict[str, Any]:
    """The group with its trajectories in `encoding` (rolltap.wire): from `recent` when it
    still holds them, else read from the store now."""
    built = None if recent is None else recent.get(record.seq)
    if built is None:
        views = await store.rollouts(ids=list(record.rollout_ids))
        by_id = {v.id: v for v in views}
        built = await build_trajectories(store, [by_id[i] for i in record.rollout_ids])
    return pack_group(batch_id, spec, record, built, encoding)


def pack_group(
    batch_id: str,
    spec: BatchSpec,
    record: GroupRecord,
    built: Sequence[RolloutTrajectories],
    encoding: str,
) -> dict[str, Any]:
    samples = [
        _sample(b, staleness, stale, reward)
        for b, staleness, stale, reward in zip(
            built, record.staleness, record.stale, record.rewards, strict=True
        )
    ]
    rows = [trajectory_row(t) for b in built for t in b.trajectories]
    message: dict[str, Any] = {
        "batch_id": batch_id,
        "group_id": f"{batch_id}/{record.task_id}",
        "seq": record.seq,
        "task_id": record.task_id,
        "informative": record.informative,
        "stale": any(record.stale),
        "hacked": any(record.hacked),
        "rewards": list(record.rewards),
        "policy_version": spec.policy_version,
        "labels": dict(spec.labels),
        "samples": samples,
        "encoding": encoding,
    }
    if encoding == "arrow":
        message["arrow"] = base64.b64encode(wire.rows_to_arrow(rows)).decode("ascii")
    else:
        message["trajectories"] = [wire.row_to_json(r) for r in rows]
    return message


def _sample(
    built: RolloutTrajectories, staleness: int | None, stale: bool, reward: float | None
) -> dict[str, Any]:
    view: RolloutView = built.rollout
    versions = [v for t in built.trajectories for v in t.weight_versions]
    oldest, newest = version_range(versions)
    return {
        "rollout_id": view.id,
        "sample_index": view.sample_index,
        "attempt": view.attempt,
        "status": view.status.value,
        "reward": reward,
        "verdict": view.verdict.value,
        "error": view.error,
        "n_calls": view.n_calls,
        "n_tokens": view.n_tokens,
        "min_version": oldest,
        "max_version": newest,
        "staleness": staleness,
        "stale": stale,
        "stale_action": (stale_mark(view.meta) or {}).get("action"),
        "relaunch_of": view.meta.get(RELAUNCH_OF),
        "hack_flags": view.hack_flags,
        "faithfulness": built.faithfulness.share,
        "breaks": built.faithfulness.breaks,
    }


def trajectory_row(t: Trajectory) -> wire.Row:
    """A store trajectory as a wire row (numpy arrays as they are; rolltap.wire encodes)."""
    return {
        "rollout_id": t.rollout_id,
        "segment": t.segment,
        "role": t.role.value,
        "prompt_ids": t.prompt_ids,
        "response_ids": t.response_ids,
        "loss_mask": t.loss_mask,
        "logprobs": t.logprobs,
        "has_logprobs": t.has_logprobs,
        "finish_reason": t.finish_reason,
        "sampled_tokens": t.sampled_tokens,
        "lost_tokens": t.lost_tokens,
        "prompt_hash": t.prompt_hash,
        "min_version": t.min_version,
        "max_version": t.max_version,
        "call_ids": list(t.call_ids),
        "weight_versions": list(t.weight_versions),
        "turns": [turn.as_dict() for turn in t.turns],
        "link": None if t.link is None else t.link.as_dict(),
        "routed_experts": t.routed_experts,
        "weight_spans": [list(span) for span in t.weight_spans],
    }
