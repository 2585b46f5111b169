"""Groups from the rollout service (`rolltap.client.Group`) in the shapes trainers consume.

Each function returns plain Python data (dicts and lists of ints and floats), so none of the
trainers needs to be installed here: `AgentLoopOutput(**row)`, `GeneratorOutput(**batch)` or
`Sample.from_dict(row)` build the trainer's own objects from it. Every trajectory of a sample
(a rollout can split into several segments where its harness broke the token chain) becomes one
entry carrying the sample's reward; `roles` keeps only the segments a trainer wants (the main
line: "main"; side calls such as titles or summaries: "side"; n > 1 siblings: "sibling").

verl, ``AgentLoopOutput`` (verl/experimental/agent_loop/agent_loop.py), one per trajectory:

=====================  =========================================================================
``prompt_ids``         ``Trajectory.prompt_ids``: the first call's prompt as the engine saw it
``response_ids``       ``Trajectory.response_ids``: every later token, sampled or not
``response_mask``      ``Trajectory.loss_mask``: 1 where the model sampled the token
``response_logprobs``  ``Trajectory.logprobs`` (the engine's); None when it gave none
``reward_score``       ``Sample.reward`` (the verifier's); None when no verdict
``num_turns``          the prompt plus every answer and observation (``len(turns) + 1``)
``extra_fields``       ``uid`` (the group id: GRPO's grouping key), ``rollout_id``,
                       ``segment``, ``weight_versions``, ``min_version``, ``max_version``,
                       ``staleness``, ``turns`` (answer/observation spans and hashes)
=====================  =========================================================================

SkyRL, ``GeneratorOutput`` (skyrl/train/generators/base.py), one for a list of groups:

========================  ======================================================================
``prompt_token_ids``      ``Trajectory.prompt_ids`` of each trajectory
``response_ids``          ``Trajectory.response_ids``
``rewards``               ``Sample.reward`` (0.0 when no verdict)
``loss_masks``            ``Trajectory.loss_mask``
``stop_reasons``          ``Trajectory.finish_reason`` (of its last call)
``rollout_logprobs``      ``Trajectory.logprobs``; None for the whole batch when any trajectory
                          has none (SkyRL's rule: never logprobs of other tokens)
``trajectory_ids``        {``instance_id``: the task id, ``repetition_id``: the sample index}
``rollout_metrics``       mean reward, share of informative groups, weight versions seen
========================  ======================================================================

slime, ``Sample`` (slime/utils/types.py), one per trajectory:

=====================  =========================================================================
``group_index``        the group's position (``Group.seq``)
``index``              a running number over the entries returned
``tokens``             ``prompt_ids`` followed by ``response_ids``
``response_length``    ``len(response_ids)``
``loss_mask``          ``Trajectory.loss_mask`` (over the response)
``rollout_log_probs``  ``Trajectory.logprobs`` (over the response)
``reward``             ``Sample.reward``
``weight_versions``    ``Trajectory.weight_versions`` (one per merged call)
``status``             ``completed``, ``truncated`` (its last call hit the length limit),
                       ``aborted`` (the rollout was cancelled) or ``failed``
``prompt``/``response`` empty: the service sends tokens; decode them if text is wanted
``metadata``           ``rollout_id``, ``segment``, ``task_id``, ``turns``, ``min_version``,
                       ``max_version``, ``staleness``
=====================  =========================================================================

and ``rollout_routed_experts``: ``Trajectory.routed_experts`` (MoE routing replay, R3), a numpy
array of ``len(tokens) - 1`` rows of layers x top-k, row i for token i, as slime's own SGLang
rollout keeps it (an SGLang engine sends layers * top-k per row: reshape with the model's layer
count); None when not captured.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

from .client import Group, Sample, Trajectory

ALL_ROLES = ("main", "side", "sibling")


def _entries(group: Group, roles: Sequence[str]) -> Iterable[tuple[Sample, Trajectory]]:
    for sample in group.samples:
        for trajectory in sample.trajectories:
            if trajectory.role in roles:
                yield sample, trajectory


def _logprobs(t: Trajectory) -> list[float] | None:
    return t.logprobs.tolist() if t.has_logprobs else None


def to_verl(group: Group, roles: Sequence[str] = ALL_ROLES) -> list[dict[str, Any]]:
    """`AgentLoopOutput` fields for each trajectory of the group (add your own `metrics`)."""
    return [
        {
            "prompt_ids": t.prompt_ids.tolist(),
            "response_ids": t.response_ids.tolist(),
            "response_mask": t.loss_mask.tolist(),
            "response_logprobs": _logprobs(t),
            "reward_score": sample.reward,
            "num_turns": len(t.turns) + 1,
            "extra_fields": {
                "uid": group.group_id,
                "rollout_id": t.rollout_id,
                "segment": t.segment,
                "weight_versions": list(t.weight_versions),
                "min_version": t.min_version,
                "max_version": t.max_version,
                "staleness": sample.staleness,
                "turns": [asdict(turn) for turn in t.turns],
            },
        }
        for sample, t in _entries(group, roles)
    ]


def to_skyrl(groups: Sequence[Group], roles: Sequence[str] = ALL_ROLES) -> dict[str, Any]:
    """`GeneratorOutput` for every trajectory of the groups, in order."""
    entries = [(g, s, t) for g in groups for s, t in _entries(g, roles)]
    complete = all(t.has_logprobs for _, _, t in entries)
    rewards = [0.0 if s.reward is None else s.reward for _, s, _ in entries]
    return {
        "prompt_token_ids": [t.prompt_ids.tolist() for _, _, t in entries],
        "response_ids": [t.response_ids.tolist() for _, _, t in entries],
        "rewards": rewards,
        "loss_masks": [t.loss_mask.tolist() for _, _, t in entries],
        "stop_reasons": [t.finish_reason or "" for _, _, t in entries],
        "rollout_logprobs": [t.logprobs.tolist() for _, _, t in entries] if complete else None,
        "trajectory_ids": [
            {"instance_id": g.task_id, "repetition_id": s.sample_index} for g, s, _ in entries
        ],
        "rollout_metrics": {
            "mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
            "informative_groups": sum(g.informative for g in groups) / max(1, len(groups)),
            "weight_versions": sorted(
                {str(v) for _, _, t in entries for v in t.weight_versions if v is not None}
            ),
        },
    }


def to_slime(
    group: Group, roles: Sequence[str] = ALL_ROLES, start_index: int = 0
) -> list[dict[str, Any]]:
    """`Sample` fields (for `Sample.from_dict`) for each trajectory of the group."""
    return [
        {
            "group_index": group.seq,
            "index": start_index + i,
            "prompt": "",
            "tokens": t.prompt_ids.tolist() + t.response_ids.tolist(),
            "response": "",
            "response_length": len(t.response_ids),
            "reward": sample.reward,
            "loss_mask": t.loss_mask.tolist(),
            "rollout_log_probs": _logprobs(t),
            "weight_versions": [str(v) for v in t.weight_versions if v is not None],
            "status": _slime_status(sample, t),
            "rollout_routed_experts": t.routed_experts,
            "metadata": {
                "rollout_id": t.rollout_id,
                "segment": t.segment,
                "task_id": group.task_id,
                "min_version": t.min_version,
                "max_version": t.max_version,
                "staleness": sample.staleness,
                "turns": [asdict(turn) for turn in t.turns],
            },
        }
        for i, (sample, t) in enumerate(_entries(group, roles))
    ]


def _slime_status(sample: Sample, t: Trajectory) -> str:
    if sample.status == "cancelled":
        return "aborted"
    if sample.status not in ("finished", "timed_out", "budget_exceeded"):
        return "failed"
    return "truncated" if t.finish_reason == "length" else "completed"
