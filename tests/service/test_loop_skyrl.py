"""rolltap.loops.skyrl.RolltapGenerator called as SkyRL's trainer calls its generator: SkyRL's
PromptDataset reads a parquet file of rows that name rolltap tasks, SkyRL's
prepare_generator_input repeats them into a GeneratorInput with SkyRL's vLLM sampling
parameters, and the GeneratorOutput passes SkyRL's validate_generator_output,
get_metrics_from_generator_output and concatenate_generator_outputs. The rollouts run on the
real rollout service in front of a fake engine; the output is checked against rolltap's store.

SkyRL 0.3.0 (the last release for Python 3.11) is installed without its GPU dependencies
(.ci/setup-trainers); on 3.11 its modules are imported as tests/support/trainer_frameworks.py
`import_skyrl` explains. The module skips without it.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rolltap.store import Store
from tests.support.chats import smollm2_tokenizer
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import fake_engine
from tests.support.service import TWO_TURNS, running_service
from tests.support.trainer_frameworks import import_skyrl, stored, task

import_skyrl()

from skyrl.backends.skyrl_train.inference_servers.engine_utils import (  # noqa: E402
    get_sampling_params_for_backend,
)
from skyrl.train.config import SamplingParams  # noqa: E402
from skyrl.train.dataset import PromptDataset  # noqa: E402
from skyrl.train.generators.base import GeneratorInterface  # noqa: E402
from skyrl.train.generators.utils import (  # noqa: E402
    concatenate_generator_outputs,
    get_metrics_from_generator_output,
    prepare_generator_input,
)
from skyrl.train.utils.trainer_utils import validate_generator_output  # noqa: E402

from rolltap.loops.common import LoopSettings  # noqa: E402
from rolltap.loops.skyrl import RolltapGenerator  # noqa: E402

pytestmark = pytest.mark.slow


def _dataset(tmp_path: Path) -> Path:
    """Two prompts in SkyRL's dataset format (prompt, env_class, other columns: env_extras)."""
    rows = [
        {"prompt": [{"role": "user", "content": f"say yes ({t})"}], "rolltap_task": task(t)}
        for t in ("alpha", "beta")
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


async def test_skyrl_generator_output_is_what_rolltap_recorded(
    store: Store, tmp_path: Path
) -> None:
    tokenizer = smollm2_tokenizer()
    dataset = PromptDataset([str(_dataset(tmp_path))], tokenizer, 512, num_workers=1)
    prompts = dataset.collate_fn([dataset[i] for i in range(len(dataset))])
    sampling = get_sampling_params_for_backend(
        "vllm", SamplingParams(temperature=0.6, top_p=0.95, max_generate_length=200)
    )
    # As SkyRL's trainer: each prompt twice (GRPO), in a GeneratorInput.
    generator_input, uids = prepare_generator_input(
        prompts, 2, sampling, "rolltap", training_phase="train", global_step=3
    )
    # SkyRL's batches put the repetitions of a prompt side by side; rolltap's groups need not
    # arrive in that order: the output must still follow the input.
    generator_input["trajectory_ids"] = generator_input["trajectory_ids"][::-1]
    for key in ("prompts", "env_classes", "env_extras"):
        generator_input[key] = generator_input[key][::-1]  # type: ignore[literal-required]
    uids = uids[::-1]

    fake = FakeVLLM(script=lambda body: Reply(text="yes"))
    async with (
        fake_engine(fake) as engine,
        running_service(
            store, engine.url, logs=tmp_path / "logs", scripts={"two-turns": TWO_TURNS}
        ) as service,
    ):
        generator = RolltapGenerator(
            LoopSettings(url=service.url, token="", harness="two-turns"), tokenizer=tokenizer
        )
        assert isinstance(generator, GeneratorInterface)
        output = await generator.generate(generator_input)

    validate_generator_output(len(generator_input["prompts"]), output)
    metrics = get_metrics_from_generator_output(output, uids)
    assert metrics["avg_score"] == 1.0
    assert metrics["pass_at_n"] == 1.0
    merged = concatenate_generator_outputs([output])
    assert merged["response_ids"] == output["response_ids"]
    assert output["trajectory_ids"] is generator_input["trajectory_ids"]

    views = {v.id: v for v in await store.rollouts()}
    batch_ids = {v.batch_id for v in views.values()}
    assert len(batch_ids) == 1, "one service batch for the whole GeneratorInput"
    (batch_id,) = batch_ids
    assert batch_id is not None
    trajectories = await stored(store, batch_id)
    assert len(trajectories) == 4
    by_row = {
        (views[t.rollout_id].task_id, views[t.rollout_id].sample_index): t for t in trajectories
    }
    for i, trajectory_id in enumerate(generator_input["trajectory_ids"]):
        extras = generator_input["env_extras"]
        assert extras is not None
        t = by_row[(extras[i]["rolltap_task"]["id"], trajectory_id.repetition_id)]
        assert output["prompt_token_ids"][i] == t.prompt_ids.tolist()
        assert output["response_ids"][i] == t.response_ids.tolist()
        assert output["loss_masks"][i] == t.loss_mask.tolist()
        assert output["rollout_logprobs"] is not None
        assert output["rollout_logprobs"][i] == t.logprobs.tolist()
        assert output["stop_reasons"][i] == "stop"
    assert output["rewards"] == [1.0] * 4
    assert output["rollout_metrics"]["rolltap/split_rollouts"] == 0

    # SkyRL's sampling parameters were imposed on every engine call.
    calls = [body for path, _, body in fake.requests if path.endswith("/chat/completions")]
    assert len(calls) == 8
    assert all(c["temperature"] == 0.6 and c["max_tokens"] == 200 for c in calls)
