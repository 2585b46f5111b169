"""rolltap.loops.verl.RolltapAgentLoop run by verl itself: verl's RLHFDataset reads a parquet
file of rows that name rolltap tasks, the batch is built and repeated as verl's PPO trainer does,
and verl's AgentLoopWorker (constructed from verl's generated trainer config, loading a real
tokenizer) instantiates the loop from an agent-loop config file and post-processes what it
returns into verl's DataProto. The rollouts run on the real rollout service in front of a fake
engine; the tensors verl built are checked against the trajectories in rolltap's store.

verl 0.9.1 is installed without its GPU dependencies (.ci/setup-trainers); the module skips
without it.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rolltap.store import Store
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import fake_engine
from tests.support.service import TWO_TURNS, running_service
from tests.support.trainer_frameworks import smollm2_model_dir, stored, task

pytest.importorskip("verl", reason="verl is not installed (.ci/setup-trainers)")

import verl
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    AgentLoopWorker,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

from rolltap.loops.verl import RolltapAgentLoop

pytestmark = pytest.mark.slow

PROMPT_LENGTH = 256
RESPONSE_LENGTH = 64


def _config(model: Path, loops: Path) -> Any:
    """verl's own generated PPO trainer config, as a run would set it for this loop."""
    generated = Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml"
    config = OmegaConf.load(generated)
    rollout = config.actor_rollout_ref.rollout
    config.actor_rollout_ref.model.path = str(model)
    rollout.name = "vllm"
    rollout.n = 2
    rollout.prompt_length = PROMPT_LENGTH
    rollout.response_length = RESPONSE_LENGTH
    rollout.agent.agent_loop_config_path = str(loops)
    config.data.max_prompt_length = PROMPT_LENGTH
    return config


def _dataset(tmp_path: Path) -> Path:
    """Two rows in verl's dataset format, each naming its rolltap task and its agent loop."""
    rows = [
        {
            "data_source": "rolltap",
            "agent_name": agent,
            "prompt": [{"role": "user", "content": f"say yes ({task_id})"}],
            "extra_info": {"index": i, "rolltap_task": task(task_id)},
        }
        for i, (task_id, agent) in enumerate(
            [("two-turns", "rolltap_two_turns"), ("oracle", "rolltap_oracle")]
        )
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


async def test_verl_agent_loop_worker_trains_on_what_rolltap_recorded(
    store: Store, tmp_path: Path
) -> None:
    model = smollm2_model_dir()
    fake = FakeVLLM(script=lambda body: Reply(text="yes"))
    async with (
        fake_engine(fake) as engine,
        running_service(
            store, engine.url, logs=tmp_path / "logs", scripts={"two-turns": TWO_TURNS}
        ) as service,
    ):
        loops = tmp_path / "agent_loops.yaml"
        target = "rolltap.loops.verl.RolltapAgentLoop"
        settings = {"_target_": target, "url": service.url, "token": ""}
        entries = [
            {"name": "rolltap_two_turns", **settings, "harness": "two-turns", "labels": {"t": 1}},
            {"name": "rolltap_oracle", **settings, "harness": "oracle"},
        ]
        OmegaConf.save(OmegaConf.create(entries), loops)
        config = _config(model, loops)
        worker = AgentLoopWorker(config, llm_client=None)

        # As verl's RayPPOTrainer.fit: dataset rows, collated, a uid per prompt, repeated n times.
        dataset = RLHFDataset([str(_dataset(tmp_path))], worker.tokenizer, config.data)
        batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(2)], object)
        gen_batch = batch.pop(
            batch_keys=[], non_tensor_batch_keys=["raw_prompt", "agent_name", "index"]
        )
        gen_batch.non_tensor_batch.update(batch.non_tensor_batch)
        gen_batch.meta_info["global_steps"] = 1
        gen_batch = gen_batch.repeat(repeat_times=2, interleave=True)

        output = await worker.generate_sequences(gen_batch)

    assert isinstance(output, DataProto)
    assert len(output) == 4
    infos = list(output.non_tensor_batch["rolltap"])
    assert [i["task_id"] for i in infos] == ["two-turns", "two-turns", "oracle", "oracle"]
    assert len({i["batch_id"] for i in infos}) == 4, "each row ran as a rollout of its own"
    # verl's GRPO grouping is its own uid, untouched by the loop.
    uids = output.non_tensor_batch["uid"]
    assert uids[0] == uids[1] != uids[2] == uids[3]
    scores = output.batch["rm_scores"].sum(dim=1).tolist()
    assert scores == [1.0, 1.0, 1.0, 1.0]

    for row, info in enumerate(infos):
        prompt = output.batch["prompts"][row]
        attention = output.batch["attention_mask"][row]
        prompt_ids = prompt[attention[:PROMPT_LENGTH].bool()].tolist()
        response_width = int(attention[PROMPT_LENGTH:].sum())
        response_ids = output.batch["responses"][row][:response_width].tolist()
        mask = output.batch["response_mask"][row][:response_width].tolist()
        logprobs = output.batch["rollout_log_probs"][row][:response_width].tolist()
        trajectories = await stored(store, info["batch_id"])
        if info["task_id"] == "oracle":
            # The oracle made no model call: verl's rendering of the row, no response.
            assert trajectories == []
            assert info["segments"] == 0
            assert response_width == 0
            rendered = worker.tokenizer.apply_chat_template(
                [{"role": "user", "content": "say yes (oracle)"}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
            assert prompt_ids == list(rendered)
            continue
        (t,) = trajectories
        assert info["rollout_id"] == t.rollout_id
        assert prompt_ids == t.prompt_ids.tolist()
        assert response_ids == t.response_ids.tolist()
        assert mask == t.loss_mask.tolist()
        assert logprobs == pytest.approx(t.logprobs.tolist())
        assert 0 < sum(mask) < len(mask), "two answers and an observation"
        assert [turn["kind"] for turn in info["turns"]] == ["answer", "observation", "answer"]
        assert output.non_tensor_batch["__num_turns__"][row] == 4


async def test_the_loop_verl_instantiates_returns_its_output_type(
    store: Store, tmp_path: Path
) -> None:
    """The registered loop, built as AgentLoopWorker._run_agent_loop builds one, returns verl's
    AgentLoopOutput with exactly the stored arrays; a long response is cut to
    rollout.response_length as verl's own loops cut theirs."""
    assert _agent_loop_registry["rolltap"] == {"_target_": "rolltap.loops.verl.RolltapAgentLoop"}
    model = smollm2_model_dir()
    fake = FakeVLLM(script=lambda body: Reply(text="yes " * 40))
    async with (
        fake_engine(fake) as engine,
        running_service(
            store, engine.url, logs=tmp_path / "logs", scripts={"two-turns": TWO_TURNS}
        ) as service,
    ):
        import hydra

        config = _config(model, tmp_path / "unused.yaml")
        config.actor_rollout_ref.rollout.agent.agent_loop_config_path = None
        worker = AgentLoopWorker(config, llm_client=None)
        loop = hydra.utils.instantiate(
            config={**_agent_loop_registry["rolltap"], "url": service.url, "harness": "two-turns"},
            trainer_config=DictConfigWrap(config=config),
            server_manager=None,
            tokenizer=worker.tokenizer,
            processor=None,
            hf_model_type=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(config.data),
            tools=ToolListWrap([]),
        )
        assert isinstance(loop, RolltapAgentLoop)
        sampling = {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "logprobs": True}
        result = await loop.run(
            sampling,
            raw_prompt=np.array([{"role": "user", "content": "say yes"}], dtype=object),
            extra_info={"index": 0, "rolltap_task": task("long")},
            index=0,
        )

    assert isinstance(result, AgentLoopOutput)
    (t,) = await stored(store, result.extra_fields["rolltap"]["batch_id"])
    assert len(t.response_ids) > RESPONSE_LENGTH
    assert result.prompt_ids == t.prompt_ids.tolist()
    assert result.response_ids == t.response_ids[:RESPONSE_LENGTH].tolist()
    assert result.response_mask == t.loss_mask[:RESPONSE_LENGTH].tolist()
    assert result.response_logprobs == t.logprobs[:RESPONSE_LENGTH].tolist()
    assert result.reward_score == 1.0
    assert result.extra_fields["rolltap"]["cut"] is True
    assert result.metrics.generate_sequences > 0
    # The sampling verl asked for was imposed on every engine call.
    calls = [body for path, _, body in fake.requests if path.endswith("/chat/completions")]
    assert calls
    assert all(c["temperature"] == 0.7 and c["top_p"] == 0.9 for c in calls)
    assert not any("top_k" in c for c in calls)
