"""A batch's outcome per task (samples, mean reward, pass@k) and in total (time, calls, tokens)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from ..store import RolloutStatus, RolloutView

PASS_REWARD = 1.0
"""A sample passes when its reward reaches this (binary tasks score 0 or 1)."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c passed (Chen et al., 2021)."""
    if k > n:
        return float("nan")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass(frozen=True)
class TaskSummary:
    task_id: str
    samples: int
    finished: int
    mean_reward: float | None
    passed: int
    pass_at_1: float
    pass_at_k: float
    k: int
    statuses: dict[str, int]


@dataclass(frozen=True)
class BatchSummary:
    batch_id: str
    tasks: list[TaskSummary]
    rollouts: int
    seconds: float
    calls: int
    tokens: int
    mean_reward: float | None
    statuses: dict[str, int]


def summarize(batch_id: str, rollouts: Sequence[RolloutView], seconds: float) -> BatchSummary:
    """`rollouts`: the current attempt of every sample (superseded attempts left out)."""
    by_task: dict[str, list[RolloutView]] = defaultdict(list)
    for r in rollouts:
        by_task[r.task_id or "-"].append(r)
    tasks = []
    for task_id in sorted(by_task):
        views = by_task[task_id]
        rewards = [r.reward for r in views if r.reward is not None]
        n = len(views)
        passed = sum(1 for r in rewards if r >= PASS_REWARD)
        statuses: dict[str, int] = defaultdict(int)
        for r in views:
            statuses[r.status.value] += 1
        tasks.append(
            TaskSummary(
                task_id=task_id,
                samples=n,
                finished=sum(1 for r in views if r.status is not RolloutStatus.CANCELLED),
                mean_reward=sum(rewards) / len(rewards) if rewards else None,
                passed=passed,
                pass_at_1=pass_at_k(n, passed, 1),
                pass_at_k=pass_at_k(n, passed, n),
                k=n,
                statuses=dict(statuses),
            )
        )
    all_rewards = [r.reward for r in rollouts if r.reward is not None]
    statuses_all: dict[str, int] = defaultdict(int)
    for r in rollouts:
        statuses_all[r.status.value] += 1
    return BatchSummary(
        batch_id=batch_id,
        tasks=tasks,
        rollouts=len(rollouts),
        seconds=seconds,
        calls=sum(r.n_calls for r in rollouts),
        tokens=sum(r.n_tokens for r in rollouts),
        mean_reward=sum(all_rewards) / len(all_rewards) if all_rewards else None,
        statuses=dict(statuses_all),
    )


def current_attempts(rollouts: Sequence[RolloutView]) -> list[RolloutView]:
    """The latest attempt of each (task, sample)."""
    latest: dict[tuple[str | None, int | None], RolloutView] = {}
    for r in rollouts:
        slot = (r.task_id, r.sample_index)
        if slot not in latest or r.attempt > latest[slot].attempt:
            latest[slot] = r
    return list(latest.values())
