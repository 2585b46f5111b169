"""slime's rollout function on rolltap: each prompt group slime's data source hands out runs as a
rolltap task with a real harness, one sample per rollout, and slime trains on the token ids, loss
masks and logprobs rolltap recorded.

slime loads it with `--rollout-function-path rolltap.loops.slime.generate_rollout` and calls
`generate_rollout(args, rollout_id, data_source, evaluation=False)` once per rollout step; the
settings come from slime's args, prefixed, which a `--custom-config-path` YAML file sets:

    rolltap_url: http://127.0.0.1:8100      # or ROLLTAP_URL
    rolltap_harness: mini-swe-agent
    rolltap_sandbox: docker
    rolltap_budgets: {max_calls: 50, timeout: 900}

Each row carries its task in its metadata (`--metadata-key`, by default the `metadata` column)
under `rolltap_task`: a task object in the JSONL shorthand or a path on the server. The function
takes `args.rollout_batch_size` groups from `data_source.get_samples`, runs them as one service
batch (`args.n_samples_per_prompt` samples per task), and returns the same groups, `Sample` by
`Sample`, filled in (the shape slime's default rollout returns: list of groups of samples):

=====================  ============================================================================
``tokens``             the trajectory's prompt ids followed by its response ids
``response_length``    the number of response ids
``loss_mask``          1 where the model sampled the token
``rollout_log_probs``  the engine's logprobs (None when it gave none)
``reward``             the verifier's reward; 0.0 when it gave none (``metadata`` says so)
``status``             COMPLETED, TRUNCATED (the last call hit its length limit), ABORTED (the
                       rollout was cancelled) or FAILED
``weight_versions``    the weight version of each merged call
``metadata``           ``rolltap``: batch, rollout, status, segments, versions, turns
=====================  ============================================================================

The trajectory is `rolltap.loops.common.final_trajectory`'s. A rollout that yielded none is
FAILED with `remove_sample` set, its tokens the prompt's (rendered by the `args.hf_checkpoint`
tokenizer when the data source gave none). Sampling: slime's `rollout_temperature`,
`rollout_top_p`, `rollout_top_k` and `rollout_max_response_len` (each call's limit) are imposed
on every call. Evaluation is not served here: point `--eval-function-path` at an evaluation
rollout.

slime is not on PyPI; this module imports none of it and works on the `Sample` objects the data
source gives (their fields as in slime/utils/types.py).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import Any

from ..client import Group, Sample, Trajectory
from .common import (
    RAN_TO_AN_END,
    LoopError,
    LoopSettings,
    final_trajectory,
    run_tasks,
    task_from,
    trajectory_info,
)

__all__ = ["generate_rollout"]

PREFIX = "rolltap_"


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> list[list[Any]]:
    """slime's rollout function: `args.rollout_batch_size` groups, filled by rolltap."""
    if evaluation:
        raise NotImplementedError(
            "rolltap.loops.slime serves training rollouts; set --eval-function-path"
        )
    settings = LoopSettings.from_options(vars(args), prefix=PREFIX)
    groups: list[list[Any]] = data_source.get_samples(args.rollout_batch_size)
    sizes = {len(g) for g in groups}
    if len(sizes) != 1:
        raise LoopError(f"every group needs as many samples; got {sorted(sizes)}")
    tasks = [task_from({"metadata": g[0].metadata}, settings.task_key, "metadata") for g in groups]
    sampling = {
        "temperature": getattr(args, "rollout_temperature", None),
        "top_p": getattr(args, "rollout_top_p", None),
        "top_k": getattr(args, "rollout_top_k", None),
        "max_tokens": getattr(args, "rollout_max_response_len", None),
    }
    done = asyncio.run(_run(settings, tasks, sizes.pop(), sampling, {"rollout_id": rollout_id}))
    for slime_group, group in zip(groups, done, strict=True):
        samples = sorted(group.samples, key=lambda s: s.sample_index)
        for slime_sample, sample in zip(slime_group, samples, strict=True):
            _fill(args, slime_sample, group, sample)
    return groups


async def _run(
    settings: LoopSettings,
    tasks: Sequence[Any],
    samples_per_task: int,
    sampling: dict[str, Any],
    labels: dict[str, Any],
) -> list[Group]:
    async with settings.client() as client:
        return await run_tasks(
            client, tasks, samples_per_task, settings, sampling=sampling, labels=labels
        )


def _fill(args: Any, out: Any, group: Group, sample: Sample) -> None:
    """Write a rolltap sample into slime's `Sample` in place."""
    t = final_trajectory(sample)
    status = out.Status
    info = trajectory_info(group, sample, t)
    info["reward"] = sample.reward
    out.metadata = {**(out.metadata or {}), "rolltap": info}
    out.reward = 0.0 if sample.reward is None else float(sample.reward)
    out.response = ""
    if t is None:
        out.tokens = list(out.tokens or []) or _prompt_ids(args, out.prompt)
        out.response_length = 0
        out.loss_mask = []
        out.rollout_log_probs = []
        out.weight_versions = []
        out.status = status.ABORTED if sample.status == "cancelled" else status.FAILED
        out.remove_sample = True
        return
    out.tokens = t.prompt_ids.tolist() + t.response_ids.tolist()
    out.response_length = len(t.response_ids)
    out.loss_mask = t.loss_mask.tolist()
    out.rollout_log_probs = t.logprobs.tolist() if t.has_logprobs else None
    out.weight_versions = [str(v) for v in t.weight_versions if v is not None]
    out.status = getattr(status, _status(sample, t))


def _status(sample: Sample, t: Trajectory) -> str:
    if sample.status == "cancelled":
        return "ABORTED"
    if sample.status not in RAN_TO_AN_END:
        return "FAILED"
    return "TRUNCATED" if t.finish_reason == "length" else "COMPLETED"


def _prompt_ids(args: Any, prompt: Any) -> list[int]:
    """The prompt as slime's own rollout tokenizes one it has no tokens for (text as it is,
    messages through the chat template), with the `args.hf_checkpoint` tokenizer."""
    path = getattr(args, "hf_checkpoint", None)
    if not path or not prompt:
        return []
    tokenizer = _tokenizer(str(path))
    if isinstance(prompt, str):
        return list(tokenizer.encode(prompt, add_special_tokens=False))
    rendered = tokenizer.apply_chat_template(
        list(prompt), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return list(rendered)


@functools.cache
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=True)
