"""A GRPO group's samples are distinct draws even when the batch imposes a seed, and a rerun of
the batch reproduces them sample by sample: the built-in SmolLM2 engine at temperature 1, one
task, four samples (`rolltap run`'s path: run_batch with the batch's sampling in its meta)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from rolltap.engine.launch import EngineProcess
from rolltap.proxy.upstream.sampling import derived_seed
from rolltap.runner import run_batch
from rolltap.runner.tasks import load_tasks
from rolltap.store import Store
from tests.support.fake_harness import ShellHarness, cleanup, shell_installation
from tests.support.sandboxes import provider_of

pytestmark = [pytest.mark.model]
ROOT = Path(__file__).resolve().parents[2]
ASKS = 'python3 "$ROLLTAP_ASK" "Write one short sentence about the sea."'
SEED = 20261126


@pytest.fixture
def installed() -> Iterator[Any]:
    inst = shell_installation()
    yield inst
    cleanup(inst)


async def _answers(
    store: Store, engine: EngineProcess, installed: Any, tmp_path: Path, batch: str
) -> dict[int, tuple[int, str]]:
    (task,) = [t for t in load_tasks(ROOT / "examples" / "tasks") if t.id == "hello-file"]
    async with provider_of("local", tmp_path / batch) as provider:
        result = await run_batch(
            [task],
            harness=ShellHarness(ASKS),
            installed=installed,
            harness_from="host",
            sandbox=provider,
            samples=4,
            # One at a time: the engine's batched arithmetic then matches from run to run.
            concurrency=1,
            backends=[engine.url],
            store=store,
            batch=batch,
            meta={"sampling": {"temperature": 1.0, "top_p": 1.0, "seed": SEED}},
            logs_root=tmp_path / batch / "logs",
        )
    answers: dict[int, tuple[int, str]] = {}
    for r in result.results:
        (call,) = await store.calls(r.rollout_id)
        bodies = await store.call_bodies(call.id)
        sent = orjson.loads(bodies.engine_request or b"{}")
        reply = orjson.loads(bodies.response or b"{}")
        assert r.sample_index is not None
        answers[r.sample_index] = (sent["seed"], reply["choices"][0]["message"]["content"])
    return answers


async def test_four_samples_four_draws_and_a_rerun_draws_them_again(
    smollm_engine: EngineProcess, store: Store, installed: Any, tmp_path: Path
) -> None:
    first = await _answers(store, smollm_engine, installed, tmp_path, "seeded-a")
    again = await _answers(store, smollm_engine, installed, tmp_path, "seeded-b")

    assert sorted(first) == [0, 1, 2, 3]
    assert {s: seed for s, (seed, _) in first.items()} == {
        s: derived_seed(SEED, "hello-file", s, 0, 0) for s in range(4)
    }
    texts = [first[s][1] for s in range(4)]
    assert len(set(texts)) == 4, f"the group's samples were not distinct draws: {texts}"
    assert again == first, "the same batch seed must reproduce each sample's draw"
