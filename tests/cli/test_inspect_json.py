"""`rolltap ls --json` (JSON Lines) and `rolltap show --json` (one document): stable field names
for auditors' own tools, the same values the store's reader API returns."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from click.testing import CliRunner

from rolltap.cli.main import cli
from rolltap.store import CallStatus, EgressRecord, EgressVerdict, NewRollout
from rolltap.store.events import Declared
from rolltap.store.ids import new_id
from tests.support.records import call
from tests.support.stores import opened_store

ROLLOUT_FIELDS = [
    "id",
    "batch_id",
    "task_id",
    "sample_index",
    "attempt",
    "harness",
    "model",
    "status",
    "reward",
    "verdict",
    "reward_details",
    "error",
    "max_calls",
    "max_tokens",
    "n_calls",
    "n_tokens",
    "created_at",
    "started_at",
    "finished_at",
    "head_hash",
    "head_seq",
    "key_revoked_at",
    "hack_flags",
    "meta",
]
CALL_FIELDS = [
    "id",
    "rollout_id",
    "seq",
    "dialect",
    "purpose",
    "model",
    "backend",
    "status",
    "http_status",
    "error",
    "stream",
    "capture",
    "received_at",
    "dispatched_at",
    "first_token_at",
    "finished_at",
    "weight_version",
    "finish_reason",
    "usage",
    "retry_count",
    "retry_of",
    "body_hash",
    "prompt_tokens",
    "completion_tokens",
    "n_choices",
    "bridge",
    "tool_parse",
    "weight_spans",
    "weights_digest",
    "digest",
    "hash",
]


def _populate(url: str) -> tuple[str, str]:
    async def run() -> tuple[str, str]:
        async with opened_store(url) as store:
            old = await store.create_rollout(NewRollout(batch_id="b", task_id="old", meta={"k": 1}))
            new = await store.create_rollout(NewRollout(batch_id="b", task_id="new", harness="h"))
            await store.report(new.id, Declared("running"))
            await store.append_call(call(new.id, [1, 2, 3], [4, 5, 6]))
            await store.append_call(call(new.id, [1, 2, 3, 4, 5, 6, 9], [7]))
            refused = call(new.id, [], status=CallStatus.REJECTED, http_status=403)
            refused.error = "budget spent"
            await store.append_call(refused)
            await store.report(new.id, Declared("finished"), reward=1.0)
        return old.id, new.id

    return asyncio.run(run())


def test_ls_json_is_one_object_per_rollout_newest_first(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.sqlite"
    old, new = _populate(url)

    result = CliRunner().invoke(cli, ["ls", "--json", "--db", url])

    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [r["id"] for r in rows] == [new, old]
    assert all(list(r) == ROLLOUT_FIELDS for r in rows)
    first = rows[0]
    assert (first["status"], first["reward"], first["n_calls"], first["harness"]) == (
        "finished",
        1.0,
        3,
        "h",
    )
    assert first["created_at"].endswith("+00:00")
    assert first["head_seq"] == 3
    assert len(first["head_hash"]) == 64
    assert rows[1]["meta"] == {"k": 1}
    assert rows[1]["head_hash"] is None


def test_show_json_is_one_document_with_calls_integrity_and_segments(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.sqlite"
    _, new = _populate(url)

    result = CliRunner().invoke(cli, ["show", new, "--json", "--db", url])
    text = CliRunner().invoke(cli, ["show", new, "--db", url])

    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert list(doc) == [
        "rollout",
        "calls",
        "integrity",
        "bridging",
        "faithfulness",
        "segments",
        "egress",
    ]
    assert doc["egress"] == []
    assert doc["bridging"] is None  # a rollout in normal mode
    assert list(doc["rollout"]) == ROLLOUT_FIELDS
    assert [list(c) for c in doc["calls"]] == [CALL_FIELDS] * 3
    assert [c["seq"] for c in doc["calls"]] == [1, 2, 3]
    assert doc["calls"][-1]["hash"] == doc["rollout"]["head_hash"]
    assert doc["integrity"]["ok"] is True
    assert doc["integrity"]["refused"] == [
        {"call_id": doc["calls"][2]["id"], "seq": 3, "http_status": 403, "error": "budget spent"}
    ]
    (segment,) = doc["segments"]
    assert (segment["prompt_tokens"], segment["response_tokens"]) == (3, 5)
    assert segment["call_ids"] == [c["id"] for c in doc["calls"][:2]]
    assert doc["faithfulness"]["sampled_tokens"] == 4
    # The terminal view says the same about the chain and the refused call.
    assert "intact" in text.output
    assert "refused  seq 3 (403) budget spent" in text.output


def test_show_lists_egress_requests_in_text_and_json(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"

    async def make() -> str:
        async with opened_store(url) as store:
            rollout = (await store.create_rollout(NewRollout(task_id="online"))).id
            at = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
            later, last = at + timedelta(seconds=1), at + timedelta(seconds=2)
            await store.record_egress(
                [
                    EgressRecord(
                        new_id(), rollout, at, "GET", "pypi.org", "/simple/numpy/", 200, 0, 4096,
                        EgressVerdict.ALLOWED, "on the allow-list",
                    ),
                    EgressRecord(
                        new_id(), rollout, later, "POST", "api.openai.com", "/v1/responses", 200,
                        900, 5000, EgressVerdict.INTERCEPTED, "LLM API host",
                    ),
                    EgressRecord(
                        new_id(), rollout, last, "GET", "github.com", "/x/y", 403, 0, 80,
                        EgressVerdict.DENIED, "github.com is not on this rollout's allow-list",
                    ),
                ]
            )  # fmt: skip
            return rollout

    rollout = asyncio.run(make())
    text = CliRunner().invoke(cli, ["show", rollout, "--db", url], terminal_width=200)
    document = json.loads(CliRunner().invoke(cli, ["show", rollout, "--json", "--db", url]).output)

    assert text.exit_code == 0, text.output
    assert "egress  3 requests, 1 denied" in text.output
    assert "github.com is not on this rollout's allow-list" in text.output
    assert [e["verdict"] for e in document["egress"]] == ["allowed", "intercepted", "denied"]
    assert document["egress"][1] == {
        **document["egress"][1],
        "host": "api.openai.com",
        "request_bytes": 900,
        "response_bytes": 5000,
        "at": "2026-11-23T12:00:01+00:00",
    }


def test_show_says_what_a_missing_bridge_break_rate_means(tmp_path: Path) -> None:
    """A token-in rollout whose calls all began conversations has no rate: `rolltap show` says
    why instead of a bare dash."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"

    async def make() -> str:
        async with opened_store(url) as store:
            rollout = (await store.create_rollout(NewRollout(task_id="by-hand"))).id
            await store.append_call(call(rollout, [1, 2, 3], [4, 5], bridge="first_turn"))
            await store.append_call(call(rollout, [1, 2, 6], [7], bridge="answer_dropped"))
            return rollout

    rollout = asyncio.run(make())
    shown = CliRunner().invoke(cli, ["show", rollout, "--db", url], terminal_width=200)

    assert shown.exit_code == 0, shown.output
    assert "bridge_break_rate - (no call continued a conversation)" in shown.output
    assert "answer_dropped 1, first_turn 1" in shown.output
