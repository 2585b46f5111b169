"""SkyRL's generator on rolltap: every prompt of a `GeneratorInput` runs as a rolltap task with
a real harness, its repetitions as the samples of one group, and SkyRL trains on the token ids,
loss masks and logprobs rolltap recorded.

SkyRL (`skyrl.train`) asks its experiment for a generator (`BasePPOExp.get_generator(cfg,
tokenizer, inference_engine_client)`) and awaits `generate(input_batch)` once per step; return
this one there:

    class RolltapExp(BasePPOExp):
        def get_generator(self, cfg, tokenizer, inference_engine_client):
            return RolltapGenerator(LoopSettings(url=..., harness="mini-swe-agent",
                                                 sandbox="docker"), tokenizer=tokenizer)

Each dataset row carries its task in `rolltap_task` (SkyRL passes every column other than the
prompt and env class as the row's `env_extras`): a task object in the JSONL shorthand or a path
on the server. All prompts of a batch go to the service as one batch (paths one batch each) with
`samples_per_task` = the repetitions SkyRL asked for, and the rows come back in input order.

Fields of the `GeneratorOutput` (one entry per input row; see
`rolltap.loops.common.final_trajectory` for which trajectory when a rollout has several):

==========================  ======================================================================
``prompt_token_ids``        the trajectory's prompt as the engine saw it
``response_ids``            every later token, sampled or not
``rewards``                 the verifier's reward (0.0 when it gave none)
``loss_masks``              1 where the model sampled the token
``stop_reasons``            the last call's finish reason (the rollout's status when it has none)
``rollout_logprobs``        the engine's logprobs; None for the whole batch when any row has none
``trajectory_ids``          the input's, unchanged
``rollout_metrics``         ``rolltap/...``: mean reward, rows without a verdict, failed rollouts,
                            rollouts that split into several trajectories (``failed``: those
                            whose harness or verifier broke, or that were cancelled)
==========================  ======================================================================

A rollout that yielded no trajectory comes back with the prompt rendered by the tokenizer (when
one was given) and an empty response.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skyrl.train.generators.base import GeneratorInput, GeneratorInterface, GeneratorOutput

from ..client import Group, Sample
from .common import RAN_TO_AN_END, LoopError, LoopSettings, final_trajectory, run_tasks, task_from

__all__ = ["RolltapGenerator"]


class RolltapGenerator(GeneratorInterface):  # type: ignore[misc]
    """`GeneratorInterface` backed by the rollout service (settings:
    `rolltap.loops.common.LoopSettings`, or its fields as keyword arguments)."""

    def __init__(
        self, settings: LoopSettings | None = None, *, tokenizer: Any = None, **options: Any
    ) -> None:
        self.settings = settings or LoopSettings.from_options(options)
        self.tokenizer = tokenizer

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        prompts = list(input_batch["prompts"])
        extras = input_batch.get("env_extras") or [{} for _ in prompts]
        ids = input_batch.get("trajectory_ids")
        rows = _rows_by_instance(ids, len(prompts))
        counts = {len(r) for r in rows.values()}
        if len(counts) != 1:
            raise LoopError(f"every prompt needs as many repetitions; got {sorted(counts)}")
        key = self.settings.task_key
        tasks = [task_from(extras[r[0]] or {}, key) for r in rows.values()]
        metadata = input_batch.get("batch_metadata")
        labels = {}
        if metadata is not None:
            labels = {"global_step": metadata.global_step, "phase": metadata.training_phase}
        async with self.settings.client() as client:
            groups = await run_tasks(
                client,
                tasks,
                counts.pop(),
                self.settings,
                sampling=input_batch.get("sampling_params"),
                labels=labels,
            )
        picked: list[tuple[Group, Sample] | None] = [None] * len(prompts)
        for indexes, group in zip(rows.values(), groups, strict=True):
            samples = sorted(group.samples, key=lambda s: s.sample_index)
            for i, sample in zip(indexes, samples, strict=True):
                picked[i] = (group, sample)
        return self._output(prompts, [p for p in picked if p is not None], ids)

    def _output(
        self, prompts: Sequence[Any], picked: Sequence[tuple[Group, Sample]], ids: Any
    ) -> GeneratorOutput:
        out: dict[str, list[Any]] = {
            k: [] for k in ("prompt", "response", "mask", "logprobs", "reward", "stop")
        }
        complete = True
        for prompt, (_, sample) in zip(prompts, picked, strict=True):
            t = final_trajectory(sample)
            if t is None:
                out["prompt"].append(self._render(prompt))
                out["response"].append([])
                out["mask"].append([])
                out["logprobs"].append([])
                out["stop"].append(sample.status)
            else:
                out["prompt"].append(t.prompt_ids.tolist())
                out["response"].append(t.response_ids.tolist())
                out["mask"].append(t.loss_mask.tolist())
                out["logprobs"].append(t.logprobs.tolist())
                out["stop"].append(t.finish_reason or sample.status)
                complete = complete and t.has_logprobs
            out["reward"].append(0.0 if sample.reward is None else float(sample.reward))
        samples = [s for _, s in picked]
        rewards = out["reward"]
        return {
            "prompt_token_ids": out["prompt"],
            "response_ids": out["response"],
            "rewards": rewards,
            "loss_masks": out["mask"],
            "stop_reasons": out["stop"],
            "rollout_logprobs": out["logprobs"] if complete else None,
            "trajectory_ids": ids,
            "rollout_metrics": {
                "rolltap/mean_reward": sum(rewards) / max(1, len(rewards)),
                "rolltap/no_verdict": sum(s.reward is None for s in samples),
                "rolltap/failed": sum(s.status not in RAN_TO_AN_END for s in samples),
                "rolltap/split_rollouts": sum(len(s.trajectories) > 1 for s in samples),
            },
            "trajectory_generation_times": None,
            "rollout_expert_indices": None,
            "is_last_step": None,
            "env_metrics": None,
            "pixel_values": None,
            "image_grid_thw": None,
        }

    def _render(self, prompt: Any) -> list[int]:
        if self.tokenizer is None:
            return []
        rendered = self.tokenizer.apply_chat_template(
            list(prompt), add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return list(rendered)


def _rows_by_instance(ids: Any, n: int) -> dict[str, list[int]]:
    """Input rows grouped by SkyRL's instance id, each group ordered by repetition (without ids,
    every row is its own instance)."""
    if not ids:
        return {str(i): [i] for i in range(n)}
    rows: dict[str, list[int]] = {}
    for i, trajectory_id in enumerate(ids):
        rows.setdefault(str(trajectory_id.instance_id), []).append(i)
    for indexes in rows.values():
        indexes.sort(key=lambda i: ids[i].repetition_id)
    return rows
