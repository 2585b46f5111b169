"""rolltap.loops.slime.generate_rollout called as slime calls a `--rollout-function-path`
function, checked against slime's source rather than an installed slime (slime is not on PyPI).

Read at THUDM/slime commit 624b824a898ab0ec1fcb4d373004c7f3852bf515 (2026-08-21):

- slime/ray/rollout.py: RolloutManager loads the function with `load_function`, calls
  `call_rollout_fn(fn, args, rollout_id, data_source, evaluation=False)`, runs
  `validate_rollout_id_annotated` on the result, flattens the groups, and
  `_convert_samples_to_train_data` reads `tokens`, `response_length`, `reward` (through
  `get_reward_value`), `status == Status.TRUNCATED`, `index`, `rollout_id` and `loss_mask`,
  asserting `len(loss_mask) == response_length`;
- slime/rollout/base_types.py: `call_rollout_fn` wraps a plain list (the legacy return) as the
  training output's `samples`;
- slime/rollout/data_source.py: `get_samples(n)` returns n groups of `n_samples_per_prompt`
  deep copies of a prompt `Sample`, with `group_index` and a running `index`;
- slime/utils/types.py: `Sample`'s fields and its `Status` enum (pending, completed,
  truncated, aborted, failed).

`SlimeSample` and `PromptSource` below restate those shapes (our code, not slime's), and
`slime_train_data` the checks the RolloutManager makes on what the function returns.
"""

from __future__ import annotations

import asyncio
import copy
import enum
import itertools
import json
from argparse import Namespace
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rolltap.loops.slime import generate_rollout
from rolltap.store import Store
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import fake_engine
from tests.support.service import TWO_TURNS, running_service
from tests.support.trainer_frameworks import smollm2_model_dir, stored, task

pytestmark = pytest.mark.slow


@dataclass
class SlimeSample:
    """The fields of slime's `Sample` that a rollout function and the trainer use."""

    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    remove_sample: bool = False
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)


class PromptSource:
    """A data source as slime's RolloutDataSource: groups of copies of each prompt sample."""

    def __init__(self, prompts: list[SlimeSample], n_samples_per_prompt: int) -> None:
        self.prompts = prompts
        self.n = n_samples_per_prompt
        self.group_index = itertools.count()
        self.index = itertools.count()

    def get_samples(self, num_samples: int) -> list[list[SlimeSample]]:
        groups = []
        for prompt in self.prompts[:num_samples]:
            group = []
            for _ in range(self.n):
                sample = copy.deepcopy(prompt)
                sample.index = next(self.index)
                group.append(sample)
            group_index = next(self.group_index)
            for sample in group:
                sample.group_index = group_index
            groups.append(group)
        return groups


def slime_train_data(output: Any, n_samples_per_prompt: int) -> dict[str, list[Any]]:
    """What slime's RolloutManager does with a rollout function's training output."""
    assert isinstance(output, list), "the legacy return: a list of groups"
    for group in output:
        assert isinstance(group, list)
        assert len(group) == n_samples_per_prompt
        assert all(isinstance(s, SlimeSample) for s in group), "depth 2: prompt x rollout"
    samples = list(itertools.chain.from_iterable(output))
    for s in samples:
        assert s.loss_mask is not None
        assert len(s.loss_mask) == s.response_length
        assert isinstance(s.reward, float)
        assert s.status is not SlimeSample.Status.PENDING
        if s.rollout_log_probs:
            assert len(s.rollout_log_probs) == s.response_length
    return {
        "tokens": [s.tokens for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rewards": [s.reward for s in samples],
        "truncated": [int(s.status is SlimeSample.Status.TRUNCATED) for s in samples],
        "sample_indices": [s.index for s in samples],
        "loss_masks": [
            [0] * s.response_length if s.remove_sample else s.loss_mask for s in samples
        ],
    }


async def test_slime_rollout_function_fills_slime_samples_with_what_rolltap_recorded(
    store: Store, tmp_path: Path
) -> None:
    prompts = [
        SlimeSample(prompt=f"say yes ({t})", label="yes", metadata={"rolltap_task": task(t)})
        for t in ("alpha", "beta")
    ]
    fake = FakeVLLM(script=lambda body: Reply(text="yes"))
    async with (
        fake_engine(fake) as engine,
        running_service(
            store, engine.url, logs=tmp_path / "logs", scripts={"two-turns": TWO_TURNS}
        ) as service,
    ):
        args = Namespace(
            rollout_batch_size=2,
            n_samples_per_prompt=2,
            rollout_temperature=0.8,
            rollout_top_p=1.0,
            rollout_top_k=-1,
            rollout_max_response_len=100,
            hf_checkpoint=None,
            # From slime's --custom-config-path YAML.
            rolltap_url=service.url,
            rolltap_token="",
            rolltap_harness="two-turns",
            rolltap_labels={"run": "slime-test"},
        )
        source = PromptSource(prompts, args.n_samples_per_prompt)
        # slime calls it from a Ray actor's thread, away from any event loop (the service's
        # loop here).
        output = await asyncio.to_thread(generate_rollout, args, 7, source, evaluation=False)

    data = slime_train_data(output, args.n_samples_per_prompt)
    assert data["sample_indices"] == [0, 1, 2, 3]
    assert data["rewards"] == [1.0] * 4
    assert data["truncated"] == [0] * 4
    (batch_id,) = {s.metadata["rolltap"]["batch_id"] for g in output for s in g}
    trajectories = {t.rollout_id: t for t in await stored(store, batch_id)}
    assert len(trajectories) == 4
    for group, task_id in zip(output, ("alpha", "beta"), strict=True):
        assert [s.metadata["rolltap"]["sample_index"] for s in group] == [0, 1]
        for s in group:
            info = s.metadata["rolltap"]
            assert info["task_id"] == task_id
            t = trajectories[info["rollout_id"]]
            assert s.tokens == t.prompt_ids.tolist() + t.response_ids.tolist()
            assert s.response_length == len(t.response_ids)
            assert s.loss_mask == t.loss_mask.tolist()
            assert s.rollout_log_probs == t.logprobs.tolist()
            assert s.status is SlimeSample.Status.COMPLETED
            assert s.prompt == f"say yes ({task_id})"
            assert s.label == "yes"
            assert s.metadata["rolltap_task"]["id"] == task_id
    calls = [body for path, _, body in fake.requests if path.endswith("/chat/completions")]
    assert all(c["temperature"] == 0.8 and c["max_tokens"] == 100 for c in calls)


async def test_a_rollout_without_a_trajectory_is_a_removed_failed_sample(
    store: Store, tmp_path: Path
) -> None:
    """The oracle makes no model call: slime gets the prompt's tokens, an empty response, and a
    sample left out of the loss; the task came as JSON text."""
    prompt = [{"role": "user", "content": "say yes (gamma)"}]
    metadata = {"rolltap_task": json.dumps(task("gamma"))}
    source = PromptSource([SlimeSample(prompt=prompt, metadata=metadata)], 1)
    model = smollm2_model_dir()
    fake = FakeVLLM(script=lambda body: Reply(text="yes"))
    async with (
        fake_engine(fake) as engine,
        running_service(store, engine.url, logs=tmp_path / "logs") as service,
    ):
        args = Namespace(
            rollout_batch_size=1,
            n_samples_per_prompt=1,
            hf_checkpoint=str(model),
            rolltap_url=service.url,
            rolltap_token="",
            rolltap_harness="oracle",
        )
        ((sample,),) = await asyncio.to_thread(generate_rollout, args, 0, source)

    from transformers import AutoTokenizer

    rendered = AutoTokenizer.from_pretrained(model).apply_chat_template(
        prompt, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert sample.tokens == list(rendered)
    assert sample.response_length == 0
    assert sample.loss_mask == []
    assert sample.remove_sample is True
    assert sample.status is SlimeSample.Status.FAILED
    assert sample.reward == 1.0, "the verifier's verdict on the oracle's solution"
    assert sample.metadata["rolltap"]["segments"] == 0
    slime_train_data([[sample]], 1)
