"""`rolltap export --sign` and `rolltap audit verify --export`: an export carries the heads of its
rollouts' hash chains under an HMAC with the proxy's secret; any change to the files, to the
manifest, or to the store's record afterwards is caught."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from click.testing import CliRunner, Result

from rolltap.cli.main import cli
from rolltap.store import NewRollout
from rolltap.store.events import Declared
from tests.support.records import call
from tests.support.stores import opened_store
from tests.support.tamper import fetch, tamper


def _store(url: str) -> list[tuple[str, list[str]]]:
    async def run() -> list[tuple[str, list[str]]]:
        async with opened_store(url) as store:
            made = []
            for sample in range(2):
                rollout = await store.create_rollout(
                    NewRollout(batch_id="b", task_id="t", sample_index=sample)
                )
                ids = []
                for turn, (prompt, answer) in enumerate(
                    [([1, 2, 3], [4, 5]), ([1, 2, 3, 4, 5, 6], [7])]
                ):
                    messages = [{"role": "user", "content": f"turn {t}"} for t in range(turn + 1)]
                    reply = {
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]
                    }
                    record = call(
                        rollout.id,
                        prompt,
                        answer,
                        request_body=json.dumps({"messages": messages}).encode(),
                        response_body=json.dumps(reply).encode(),
                    )
                    ids.append((await store.append_call(record)).call_id)
                await store.report(rollout.id, Declared("finished"), reward=1.0)
                made.append((rollout.id, ids))
        return made

    return asyncio.run(run())


def _run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_a_signed_parquet_export_verifies_and_carries_the_heads(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    made = _store(url)
    out = tmp_path / "batch.parquet"

    exported = _run("export", "--batch", "b", "--out", str(out), "--sign", "--db", url)
    checked = _run("audit", "verify", "--export", str(out), "--db", url)

    assert exported.exit_code == 0, exported.output
    assert f"signed: {out}.sig" in exported.output
    assert (tmp_path / "s.sqlite.secret").is_file()  # the proxy's secret, made once
    assert checked.exit_code == 0, checked.output
    assert "signature valid" in checked.output
    assert "the export is what was signed" in checked.output
    for rollout_id, _ in made:
        assert f"rollout {rollout_id}: matches the store (2 calls)" in checked.output
    manifest = json.loads((tmp_path / "batch.parquet.sig").read_text())
    heads = {r["id"]: r["head_hash"] for r in manifest["rollouts"]}
    rows = pq.read_table(out).to_pylist()
    assert {r["rollout_id"]: r["head_hash"] for r in rows} == heads
    assert all(h is not None and len(h) == 64 for h in heads.values())


def test_changes_to_the_export_or_its_manifest_are_caught(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    _store(url)
    out = tmp_path / "batch.jsonl"
    assert _run("export", "--batch", "b", "--out", str(out), "--sign", "--db", url).exit_code == 0
    sig = tmp_path / "batch.jsonl.sig"
    signed_rows = out.read_text()
    manifest = json.loads(sig.read_text())

    out.write_text(signed_rows.replace('"reward":1.0', '"reward":0.0', 1))
    changed_file = _run("audit", "verify", "--export", str(sig), "--db", url)
    out.write_text(signed_rows)
    manifest["rollouts"][0]["reward"] = 0.0
    sig.write_text(json.dumps(manifest))
    changed_manifest = _run("audit", "verify", "--export", str(out), "--db", url)
    other_secret = _run("audit", "verify", "--export", str(out), "--db", url, "--secret", "x" * 40)

    assert changed_file.exit_code == 1
    assert "batch.jsonl: changed since it was signed" in changed_file.output
    assert changed_manifest.exit_code == 1
    assert "signature INVALID" in changed_manifest.output
    assert "the manifest was altered" in changed_manifest.output
    assert other_secret.exit_code == 1
    assert "signed with another secret" in other_secret.output


def test_a_store_altered_after_the_export_no_longer_matches_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    [(rollout_id, ids), _] = _store(url)
    out = tmp_path / "atif"
    signed = _run("export", "--format", "atif", "--out", str(out), "--sign", "--db", url)
    assert signed.exit_code == 0, signed.output
    blob = asyncio.run(fetch(url, "SELECT token_ids FROM choice WHERE call_id = :c", c=ids[1]))
    forged = np.frombuffer(blob, dtype="<i4").copy()
    forged[0] = 99
    asyncio.run(
        tamper(
            url, "UPDATE choice SET token_ids = :b WHERE call_id = :c", b=forged.tobytes(), c=ids[1]
        )
    )
    (out / "extra.txt").write_text("planted")

    checked = _run("audit", "verify", "--export", str(out), "--db", url)
    resign = _run(
        "export", "--format", "atif", "--out", str(tmp_path / "again"), "--sign", "--db", url
    )

    assert checked.exit_code == 1
    assert "signature valid" in checked.output
    assert "extra.txt: not part of the signed export" in checked.output
    assert (
        f"rollout {rollout_id}: call {ids[1]} (seq 2): the record does not match" in checked.output
    )
    # What is altered is never signed again.
    assert resign.exit_code == 1
    assert "not signing: these rollouts do not verify" in resign.output
    assert rollout_id in resign.output


def test_checking_needs_the_secret_that_signed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    _store(url)
    out = tmp_path / "batch.parquet"
    assert (
        _run("export", "--out", str(out), "--sign", "--db", url, "--secret", "s" * 40).exit_code
        == 0
    )
    elsewhere = f"sqlite:///{tmp_path / 'other.sqlite'}"
    assert _run("db", "upgrade", "--db", elsewhere).exit_code == 0

    without = _run("audit", "verify", "--export", str(out), "--db", elsewhere)
    given = _run("audit", "verify", "--export", str(out), "--db", elsewhere, "--secret", "s" * 40)
    missing = _run("audit", "verify", "--export", str(tmp_path / "nope.parquet"), "--db", url)

    assert without.exit_code == 1
    assert "no proxy secret at" in without.output
    assert "Traceback" not in without.output
    assert not (tmp_path / "other.sqlite.secret").exists()  # checking never makes one up
    assert given.exit_code == 0, given.output
    assert "not in this store (only the signature was checked)" in given.output
    assert missing.exit_code == 1
    assert "no signature at" in missing.output
