"""`rolltap audit verify` on a real store: intact rollouts pass, a tampered one fails by name."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from rolltap.cli.main import cli
from rolltap.store import CallStatus, NewRollout
from rolltap.store.events import Declared
from tests.support.records import call
from tests.support.stores import opened_store
from tests.support.tamper import fetch, tamper


def _batch(url: str) -> list[tuple[str, list[str]]]:
    async def run() -> list[tuple[str, list[str]]]:
        async with opened_store(url) as store:
            made = []
            for sample in range(2):
                rollout = await store.create_rollout(
                    NewRollout(batch_id="b", task_id="t", sample_index=sample)
                )
                ids = [(await store.append_call(call(rollout.id, [1, 2, 3], [4, 5]))).call_id]
                ids.append(
                    (await store.append_call(call(rollout.id, [1, 2, 3, 4, 5, 6], [7]))).call_id
                )
                refused = call(rollout.id, [], status=CallStatus.REJECTED, http_status=403)
                refused.error = f"rollout {rollout.id} used its budget of 2 calls"
                ids.append((await store.append_call(refused)).call_id)
                await store.report(rollout.id, Declared("budget_exceeded"), error=refused.error)
                made.append((rollout.id, ids))
        return made

    return asyncio.run(run())


def test_an_intact_rollout_passes_and_lists_its_refused_call(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.sqlite"
    [(rollout_id, _), _] = _batch(url)

    result = CliRunner().invoke(cli, ["audit", "verify", rollout_id, "--db", url])

    assert result.exit_code == 0, result.output
    assert f"rollout {rollout_id}  budget_exceeded  3 calls  sealed at seq 3" in result.output
    assert "intact" in result.output
    assert "refused  seq 3 (403) rollout" in result.output


def test_a_tampered_batch_fails_and_names_the_call(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.sqlite"
    [(good, _), (bad, ids)] = _batch(url)
    blob = asyncio.run(fetch(url, "SELECT token_ids FROM choice WHERE call_id = :c", c=ids[0]))
    forged = np.frombuffer(blob, dtype="<i4").copy()
    forged[0] += 1
    asyncio.run(
        tamper(
            url, "UPDATE choice SET token_ids = :b WHERE call_id = :c", b=forged.tobytes(), c=ids[0]
        )
    )

    text = CliRunner().invoke(cli, ["audit", "verify", "--batch", "b", "--db", url])
    as_json = CliRunner().invoke(cli, ["audit", "verify", "--batch", "b", "--json", "--db", url])

    assert text.exit_code == 1, text.output
    assert f"rollout {bad}" in text.output
    assert "NOT INTACT (2 issues)" in text.output
    assert f"altered  call {ids[0]} (seq 1): the record does not match its digest" in text.output
    assert "2 rollouts: 1 intact, 1 with issues" in text.output
    every = CliRunner().invoke(cli, ["audit", "verify", "--all", "--db", url])
    assert every.exit_code == 1, every.output
    assert every.output.replace(f"rollout {good}", "").count("NOT INTACT") == 1
    assert "2 rollouts: 1 intact, 1 with issues" in every.output
    assert as_json.exit_code == 1
    objects = {o["rollout_id"]: o for o in map(json.loads, as_json.output.splitlines())}
    assert objects[good]["ok"] is True
    assert [(i["kind"], i["call_id"]) for i in objects[bad]["issues"]] == [
        ("altered", ids[0]),
        ("altered", ids[1]),
    ]
    assert objects[bad]["issues"][1]["caused_by"] == ids[0]
    assert objects[bad]["refused"][0]["http_status"] == 403


def test_verify_needs_a_rollout_a_batch_or_all(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.sqlite"
    assert CliRunner().invoke(cli, ["db", "upgrade", "--db", url]).exit_code == 0

    neither = CliRunner().invoke(cli, ["audit", "verify", "--db", url])
    both = CliRunner().invoke(cli, ["audit", "verify", "--all", "--batch", "b", "--db", url])
    unknown = CliRunner().invoke(cli, ["audit", "verify", "nope", "--db", url])
    empty = CliRunner().invoke(cli, ["audit", "verify", "--all", "--db", url])

    for refused in (neither, both):
        assert refused.exit_code == 2
        assert refused.output == (
            "Error: verify what? give one of: a ROLLOUT id, --batch NAME, --export FILE, or "
            "--all (every rollout in the store)\n"
        )
    assert unknown.exit_code == 1
    assert "no rollout 'nope'" in unknown.output
    assert "Traceback" not in unknown.output
    assert (empty.exit_code, empty.output) == (1, "Error: the store holds no rollouts yet\n")
