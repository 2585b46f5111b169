"""verl's agent loop on rolltap: each dataset row runs as a rolltap rollout of its task with a
real harness, and verl trains on the token ids, loss mask and logprobs rolltap recorded.

verl (0.9: `verl.experimental.agent_loop`) instantiates an agent loop per row with
`hydra.utils.instantiate(entry, trainer_config=..., server_manager=..., tokenizer=..., ...)`
and awaits `run(sampling_params, **row)`. Name this loop in an agent-loop config file
(`actor_rollout_ref.rollout.agent.agent_loop_config_path`) with the service's settings, which
verl passes to the constructor:

    - name: rolltap
      _target_: rolltap.loops.verl.RolltapAgentLoop
      url: http://127.0.0.1:8100          # or ROLLTAP_URL
      harness: mini-swe-agent
      sandbox: docker
      budgets: {max_calls: 50, timeout: 900}

and give rows `agent_name: rolltap` and their task in `extra_info.rolltap_task` (or a
`rolltap_task` column): a task object in the JSONL shorthand or a path on the server. Importing
this module also registers the class as "rolltap" with verl's defaults.

Fields of the `AgentLoopOutput` (one per row; see `rolltap.loops.common.final_trajectory` for
which trajectory when a rollout has several):

=====================  ============================================================================
``prompt_ids``         the trajectory's prompt as the engine saw it (left-cut to
                       ``rollout.prompt_length``, as verl cuts its own)
``response_ids``       every later token, sampled or not (cut to ``rollout.response_length``)
``response_mask``      1 where the model sampled the token
``response_logprobs``  the engine's logprobs when verl asks for them (``calculate_log_probs``)
``reward_score``       the verifier's reward; None (verl's reward function decides) when none
``num_turns``          the prompt plus every answer and observation
``metrics``            ``generate_sequences``: the seconds the rollout took
``extra_fields``       ``rolltap``: batch, rollout, status, segments, versions, turns (no ``uid``:
                       verl's own GRPO grouping stands)
=====================  ============================================================================

A rollout that yielded no trajectory (its harness failed before any call, or made none) comes
back with the row's prompt rendered by verl's tokenizer and an empty response.
"""

from __future__ import annotations

import time
from dataclasses import fields
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from .common import LoopError, LoopSettings, final_trajectory, run_tasks, task_from, trajectory_info

__all__ = ["RolltapAgentLoop"]

_SETTINGS = {f.name for f in fields(LoopSettings)}


@register("rolltap")
class RolltapAgentLoop(AgentLoopBase):  # type: ignore[misc]
    """One verl row, one rolltap rollout (settings: `rolltap.loops.common.LoopSettings`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.settings = LoopSettings.from_options(kwargs)
        super().__init__(*args, **{k: v for k, v in kwargs.items() if k not in _SETTINGS})
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        task = task_from(kwargs, self.settings.task_key, "extra_info")
        started = time.perf_counter()
        async with self.settings.client() as client:
            (group,) = await run_tasks(client, [task], 1, self.settings, sampling=sampling_params)
        elapsed = time.perf_counter() - started
        sample = group.samples[0]
        t = final_trajectory(sample)
        n = self.response_length
        if t is None:
            prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
            response_ids: list[int] = []
            mask: list[int] = []
            logprobs: list[float] = []
            turns = 1
        else:
            prompt_ids = self._cap_text_prompt_length(t.prompt_ids.tolist())
            response_ids = t.response_ids[:n].tolist()
            mask = t.loss_mask[:n].tolist()
            logprobs = t.logprobs[:n].tolist()
            turns = len(t.turns) + 1
            if sampling_params.get("logprobs") and not t.has_logprobs:
                raise LoopError(
                    f"rollout {t.rollout_id}: the engine behind rolltap gave no logprobs, "
                    "which verl's rollout.calculate_log_probs asks for"
                )
        info = trajectory_info(group, sample, t)
        info["cut"] = t is not None and (
            len(prompt_ids) < len(t.prompt_ids) or len(response_ids) < len(t.response_ids)
        )
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=mask,
            # verl batches logprobs of every row or of none: what its config asks for.
            response_logprobs=logprobs if sampling_params.get("logprobs") else None,
            reward_score=sample.reward,
            num_turns=turns,
            metrics=AgentLoopMetrics(generate_sequences=elapsed),
            # turn_scores and tool_rewards: the keys verl's own loops always set.
            extra_fields={"rolltap": info, "turn_scores": [], "tool_rewards": []},
        )
