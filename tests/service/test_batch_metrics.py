"""A trainer's figures about a batch (`POST /v1/batches/{id}/metrics`): stored in the store,
read back through the client, refused in one clear error when malformed; and the service's own
record of each batch (its session, labels, groups kept and dropped)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rolltap.client import ServiceError
from rolltap.store import Store
from rolltap.store.models import MetricsSource
from rolltap.store.training import metrics_of, sessions
from tests.service.test_batches_api import TASKS, alternating
from tests.support.proxy import fake_engine
from tests.support.service import running_service

POSTED = {
    "logprob_mismatch_max": 2.4e-5,
    "logprob_mismatch_mean": 3.0e-6,
    "loss": -0.0125,
    "checkpoint": "/ckpt/4",
    "seconds": {"sample": 41.5, "wait": 0.25, "update": 2.0},
}


async def test_posted_metrics_are_stored_and_read_back(store: Store, tmp_path: Path) -> None:
    async with (
        fake_engine(alternating()) as engine,
        running_service(store, engine.url, logs=tmp_path / "logs", admin_token="tok") as service,
    ):
        client = service.client
        batch = await client.submit(
            TASKS,
            harness="single-call",
            samples_per_task=2,
            keep="informative",
            labels={"run": "exp-1", "step": 4},
            policy_version="4",
        )
        [e async for e in client.events(batch.id)]
        first = await client.post_metrics(batch.id, POSTED)
        second = await client.post_metrics(batch.id, {"grad_norm": 0.5}, policy_version="5")
        listed = await client.metrics(batch.id)
        status = await client.batch(batch.id)
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{service.url}/v1/batches/{batch.id}/metrics", json={"metrics": {"x": 1}}
            ) as resp:
                assert resp.status == 401

    assert first["metrics"] == POSTED
    assert first["policy_version"] == "4"  # the batch's
    assert second["policy_version"] == "5"
    assert [m["metrics"] for m in listed] == [POSTED, {"grad_norm": 0.5}]
    assert [m["id"] for m in listed] == [first["id"], second["id"]]

    # Durably in the store, beside what the service recorded of the batch.
    stored = await store.db.read(metrics_of, [batch.id])
    trainer = [r for r in stored if r.source is MetricsSource.TRAINER]
    service_rows = [r for r in stored if r.source is MetricsSource.SERVICE]
    assert [r.metrics for r in trainer] == [POSTED, {"grad_norm": 0.5}]
    assert [r.metrics["status"] for r in service_rows] == ["running", "done"]
    last = service_rows[-1]
    assert last.policy_version == "4"
    assert last.metrics["labels"] == {"run": "exp-1", "step": 4}
    assert last.metrics["groups"]["complete"] == 2
    assert last.metrics["groups"]["kept"] == 2
    assert last.metrics["seconds"]["sample"] > 0
    (found,) = await store.db.read(sessions)
    assert found.session == last.session
    assert found.batches == 1
    assert status.data["session"] == last.session  # a link to its training view


MALFORMED: list[tuple[dict[str, Any], str]] = [
    ({}, "metrics"),
    ({"metrics": {}}, "metrics"),
    ({"metrics": {"loss": "x" * 600}}, "metrics.loss"),
    ({"metrics": {"loss": [1, 2]}}, "metrics.loss"),
    ({"metrics": {"seconds": {"sample": -1}}}, "metrics.seconds"),
    ({"metrics": {"seconds": 3}}, "metrics.seconds"),
    ({"metrics": {"mismatch": {"max": "big"}}}, "metrics.mismatch"),
    ({"metrics": {"x": 1}, "policy_version": 1.5}, "policy_version"),
    ({"metrics": {"x": 1}, "version": "3"}, "version"),
]
"""(body, the param its error names)"""


async def test_malformed_metrics_get_one_clear_error(store: Store, tmp_path: Path) -> None:
    answers: list[tuple[dict[str, Any], int, dict[str, Any]]] = []
    async with (
        fake_engine(alternating()) as engine,
        running_service(store, engine.url, logs=tmp_path / "logs") as service,
    ):
        batch = await service.client.submit(TASKS[:1], harness="single-call")
        [e async for e in service.client.events(batch.id)]
        async with aiohttp.ClientSession() as session:
            url = f"{service.url}/v1/batches/{batch.id}/metrics"
            for body, _ in MALFORMED:
                async with session.post(url, json=body) as resp:
                    answers.append((body, resp.status, await resp.json()))
            async with session.post(url, data=b"{not json") as resp:
                assert resp.status == 400
                assert (await resp.json())["error"]["code"] == "invalid_json"
        with pytest.raises(ServiceError) as unknown:
            await service.client.post_metrics("no-such-batch", {"x": 1})

    for (body, status, error), (_, param) in zip(answers, MALFORMED, strict=True):
        assert status == 400, body
        assert error["error"]["param"] == param, body
        assert error["error"]["code"] == "invalid_metrics"
        assert error["error"]["type"] == "invalid_request_error"
    assert unknown.value.status == 404
    trainer = await store.db.read(metrics_of, [batch.id], source=MetricsSource.TRAINER)
    assert trainer == []
