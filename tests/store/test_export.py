"""Exports for trainers: Parquet and JSON lines via `rolltap export`, and the API's JSON."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import rolltap.store
from rolltap.analysis import reader as blocking
from rolltap.cli.export import export
from rolltap.export.export import rollout_dict, rollout_trajectory_json
from rolltap.store import NewRollout, StoreReader
from rolltap.store.events import Declared
from tests.support.chats import Recorder, Renderer, smollm2_tokenizer

SYSTEM = {"role": "system", "content": "You are terse."}


@pytest.fixture
def reader(db_url: str) -> Iterator[StoreReader]:
    with rolltap.store.open(db_url) as opened:
        yield opened


def _rollout(
    reader: StoreReader,
    batch: str,
    *,
    broken: bool,
    reward: float | None,
    status: str = "finished",
) -> str:
    renderer = Renderer(smollm2_tokenizer())
    created = reader.run(reader.store.create_rollout(NewRollout(batch_id=batch, task_id="t")))
    rec = Recorder(reader.store, created.id, renderer)
    messages = [SYSTEM, {"role": "user", "content": "Shout having."}]
    sampled = renderer.ids("H") + renderer.ids("AVING<|im_end|>") if broken else None
    first = (sampled, {"content": "HAVING"}) if sampled else rec.answer("HAVING")
    reader.run(rec.call(messages, first, rec.answer("No.")))
    messages += [{"role": "assistant", "content": "HAVING"}, {"role": "user", "content": "More."}]
    reader.run(rec.call(messages, rec.answer("HAVING!")))
    reader.run(reader.store.report(created.id, Declared(status), reward=reward))
    return created.id


def test_parquet_export_round_trips(reader: StoreReader, db_url: str, tmp_path: Path) -> None:
    broken = _rollout(reader, "b1", broken=True, reward=1.0)
    clean = _rollout(reader, "b1", broken=False, reward=0.5)
    _rollout(reader, "b2", broken=False, reward=0.0)
    out = tmp_path / "t.parquet"

    result = CliRunner().invoke(export, ["--db", db_url, "--batch", "b1", "--out", str(out)])

    assert result.exit_code == 0, result.output
    assert "from 2 rollouts" in result.output
    table = pq.read_table(out)
    assert table.schema.field("prompt_ids").type == pa.list_(pa.int32())
    assert table.schema.field("response_ids").type == pa.list_(pa.int32())
    assert table.schema.field("loss_mask").type == pa.list_(pa.int8())
    assert table.schema.field("logprobs").type == pa.list_(pa.float32())
    expected = list(blocking.trajectories(reader, batch="b1"))
    assert table.num_rows == len(expected) == 5  # broken: 2 + a sibling; clean: 1 + a sibling
    rows = table.to_pylist()
    for row, t in zip(rows, expected, strict=True):
        assert (row["rollout_id"], row["segment"], row["reward"]) == (
            t.rollout_id,
            t.segment,
            t.reward,
        )
        assert row["prompt_ids"] == t.prompt_ids.tolist()
        assert row["response_ids"] == t.response_ids.tolist()
        assert row["loss_mask"] == t.loss_mask.tolist()
        assert np.array_equal(np.asarray(row["logprobs"], dtype=np.float32), t.logprobs)
    drifts = {(r["rollout_id"], r["drift"]) for r in rows if r["drift"]}
    assert drifts == {(broken, "retokenization")}
    assert {r["link_kind"] for r in rows if r["rollout_id"] == clean} == {None, "sibling"}
    detail = json.loads(next(r["drift_detail"] for r in rows if r["drift"]))
    assert detail["region"] == "sampled"


def test_jsonl_export_round_trips(reader: StoreReader, db_url: str, tmp_path: Path) -> None:
    _rollout(reader, "b1", broken=True, reward=1.0)
    out = tmp_path / "t.jsonl"

    result = CliRunner().invoke(export, ["--db", db_url, "--status", "finished", "--out", str(out)])

    assert result.exit_code == 0, result.output
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    expected = list(blocking.trajectories(reader))
    assert len(rows) == len(expected) == 3
    for row, t in zip(rows, expected, strict=True):
        assert row["response_ids"] == t.response_ids.tolist()
        assert row["loss_mask"] == t.loss_mask.tolist()
        assert np.allclose(row["logprobs"], t.logprobs)


def test_rollout_json_for_the_api(reader: StoreReader) -> None:
    rid = _rollout(reader, "b1", broken=True, reward=1.0)

    body = rollout_dict(blocking.rollout_trajectories(reader, rid))
    assert reader.run(rollout_trajectory_json(reader.store, rid)) == body

    decoded = json.loads(json.dumps(body, allow_nan=False))
    assert decoded["rollout"]["reward"] == 1.0
    assert decoded["faithfulness"]["breaks"] == {"retokenization": 1}
    assert decoded["faithfulness"]["share"] < 1
    main, sibling, broken = decoded["trajectories"]
    assert broken["link"]["drift"]["kind"] == "retokenization"
    assert sibling["link"]["kind"] == "sibling"
    assert len(main["response_ids"]) == len(main["loss_mask"]) == len(main["logprobs"])


def test_the_default_export_is_what_a_trainer_takes_as_it_comes(
    reader: StoreReader, db_url: str, tmp_path: Path
) -> None:
    """Rewarded, non-replay rollouts by default, each row saying how many rows its rollout has
    (reward repeats on each) and whether it replays another; --all exports the rest too."""
    kept = _rollout(reader, "b", broken=True, reward=1.0)
    replayed = _rollout(reader, "b", broken=False, reward=1.0)
    cancelled = _rollout(reader, "b", broken=False, reward=None, status="cancelled")
    reader.run(reader.store.update_rollout(replayed, meta={"replay_of": kept}))
    pending = reader.run(reader.store.create_rollout(NewRollout(batch_id="b", task_id="t"))).id
    default, everything = tmp_path / "default.parquet", tmp_path / "all.parquet"

    chosen = CliRunner().invoke(export, ["--db", db_url, "--batch", "b", "--out", str(default)])
    every = CliRunner().invoke(
        export, ["--db", db_url, "--batch", "b", "--all", "--out", str(everything)]
    )

    assert chosen.exit_code == 0, chosen.output
    assert "left out 3 rollouts" in chosen.output
    rows = pq.read_table(default).to_pylist()
    assert {r["rollout_id"] for r in rows} == {kept}
    assert {(r["n_segments"], r["is_replay"], r["replay_of"]) for r in rows} == {(3, False, None)}
    assert len(rows) == 3, "n_segments counts the rows the reward repeats on"
    assert every.exit_code == 0, every.output
    all_rows = pq.read_table(everything).to_pylist()
    assert {r["rollout_id"] for r in all_rows} == {kept, replayed, cancelled}  # pending: no calls
    assert {r["replay_of"] for r in all_rows if r["is_replay"]} == {kept}
    assert {r["status"] for r in all_rows if r["rollout_id"] == cancelled} == {"cancelled"}
    assert pending not in {r["rollout_id"] for r in all_rows}


_EXPORT_PROBE = """
import sys
from rolltap.cli.main import cli
try:
    cli(sys.argv[1:])
except SystemExit as e:
    assert not e.code, e.code
print("pandas" in sys.modules, file=sys.stderr)
"""


def test_a_parquet_export_leaves_pandas_unimported(tmp_path: Path) -> None:
    """pyarrow's converters import pandas where it is installed, 0.2 to 0.4 CPU-s of an export:
    the export builds its Arrow columns from buffers instead (export/columns.py)."""
    if importlib.util.find_spec("pandas") is None:
        pytest.skip("pandas is not installed, so nothing could import it")
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with rolltap.store.open(url) as opened:
        _rollout(opened, "b", broken=True, reward=1.0)
    out = tmp_path / "t.parquet"

    done = subprocess.run(
        [sys.executable, "-c", _EXPORT_PROBE, "export", "--db", url, "--out", str(out)],
        check=True,
        capture_output=True,
        text=True,
    )

    assert pq.read_table(out).num_rows == 3
    assert done.stderr.splitlines()[-1] == "False"
