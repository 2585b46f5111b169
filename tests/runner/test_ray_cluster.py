"""Rollouts on a real Ray cluster of three small nodes on this machine (ray.cluster_utils), each
offering 4 `sandbox` units, with the store on PostgreSQL: every call recorded once, and a node
whose raylet is killed mid-batch has its rollouts retried elsewhere as new attempts, with no
duplicate sample and no process left behind.

One cluster serves the module (Ray takes seconds to start); the node-killing test runs last."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import orjson
import psutil
import pytest

from rolltap.proxy.tokenin.options import TokenInOptions
from rolltap.proxy.upstream.sampling import derived_seed
from rolltap.runner.cluster.batch import run_batch_on_ray
from rolltap.runner.cluster.node import NODE
from rolltap.runner.sandboxes.docker import BASE_IMAGE
from rolltap.runner.tasks import load_tasks
from rolltap.store import RolloutStatus
from tests.support.databases import PostgresServer
from tests.support.fake_vllm import read_log
from tests.support.processes import Child, free_port, reaped, start_fake_engine
from tests.support.sandboxes import open_provider
from tests.support.service import running_service
from tests.support.stores import opened_store

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
]

SANDBOXES_PER_NODE = 4
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


@dataclass
class RayWorld:
    cluster: Cluster
    db: str
    engine: Child
    engine_log: Path
    tmp: Path


@pytest.fixture(scope="module")
def world(postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayWorld]:
    tmp = tmp_path_factory.mktemp("ray")
    name = postgres.fresh()
    log = tmp / "engine.log"
    # The head schedules nothing of ours: only the three nodes offer sandboxes.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for _ in range(3):
            cluster.add_node(num_cpus=1, resources={"sandbox": SANDBOXES_PER_NODE})
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        cluster.wait_for_nodes()
        port = free_port()
        with reaped(start_fake_engine(tmp, port, log, token_delay_ms=1, reply_tokens=4)) as kids:
            asyncio.run(kids[0].ready("/health"))
            yield RayWorld(cluster, postgres.url(name), kids[0], log, tmp)
    finally:
        ray.shutdown()
        cluster.shutdown()
        postgres.drop(name)


def _tasks(path: Path, n: int, **fields: object) -> Path:
    path.write_text(
        "".join(
            json.dumps({"id": f"t{i:02d}", "instruction": f"say {i}", **fields}) + "\n"
            for i in range(n)
        )
    )
    return path


async def test_64_rollouts_spread_over_three_nodes_each_call_recorded_once(
    world: RayWorld,
) -> None:
    tasks = _tasks(world.tmp / "say.jsonl", 16, test="test -s answer.txt")
    result = await run_batch_on_ray(
        tasks,
        address=world.cluster.address,
        harness="single-call",
        sandbox="bwrap",
        samples=4,
        backends=[world.engine.url],
        batch="say-64",
        db=world.db,
        token_in=TokenInOptions(enabled=True),
    )
    assert len(result.results) == 64
    errors = {r.error for r in result.results}
    assert {r.status for r in result.results} == {RolloutStatus.SUCCEEDED}, errors
    assert result.summary.rollouts == 64

    async with opened_store(world.db) as store:
        views = await store.rollouts(batch="say-64")
        assert len(views) == 64  # one attempt per sample: nothing was retried
        assert all(v.n_calls == 1 for v in views)
        calls = [c for v in views for c in await store.calls(v.id)]
    # Every engine request is one recorded call, and no call was recorded twice.
    seen, _ = read_log(str(world.engine_log))
    assert len(seen) == len(calls) == 64
    assert len({c.id for c in calls}) == 64
    # Token-in reached every node's proxy through the rollouts' meta: each call was decided.
    assert {c.bridge for c in calls} == {"first_turn"}
    # Ray placed them on all three nodes.
    assert len({v.meta[NODE] for v in views}) == 3


async def test_the_rollout_service_runs_its_batches_on_the_cluster(world: RayWorld) -> None:
    tasks = [{"id": f"s{i}", "instruction": f"say {i}", "test": "test -s answer.txt"} for i in "ab"]
    async with opened_store(world.db) as store:
        async with running_service(
            store, world.engine.url, logs=world.tmp / "service", ray_address=world.cluster.address
        ) as service:
            batch = await service.client.submit(
                tasks, harness="single-call", samples_per_task=2, sampling={"seed": 5}
            )
            groups = [g async for g in service.client.groups(batch.id)]
        views = await store.rollouts(batch=batch.id)
        sent = {
            (v.task_id, v.sample_index): orjson.loads(
                (await store.call_bodies(c.id)).engine_request or b"{}"
            )
            for v in views
            for c in await store.calls(v.id)
        }
    # Each node's proxy derived the batch seed per sample and salted the call with its version.
    assert {k: body["seed"] for k, body in sent.items()} == {
        (t, n): derived_seed(5, t, n, 0, 0) for t in ("sa", "sb") for n in range(2)
    }
    assert all(body["cache_salt"].startswith("rolltap-w:") for body in sent.values())
    assert sorted(g.task_id for g in groups) == ["sa", "sb"]
    assert all(s.status == "finished" for g in groups for s in g.samples)
    assert len(views) == 4
    # Each ran on a Ray node, through that node's proxy, with its one call recorded.
    nodes = {n.node_id for n in world.cluster.list_all_nodes()}
    assert all(v.meta[NODE] in nodes and v.n_calls == 1 for v in views)


async def test_each_node_builds_the_task_images_before_its_first_rollout(
    world: RayWorld,
) -> None:
    provider = await open_provider("docker", world.tmp)  # skips without a docker daemon
    try:
        root = world.tmp / "image-tasks"
        for name, step in (("quick", "true"), ("slow", "sleep 4")):
            # Fresh content each run, so each image is built here, not found from an earlier run.
            task = root / f"img-{name}"
            shutil.copytree(EXAMPLES / "hello-file", task)
            run = f"RUN {step} && echo {secrets.token_hex(6)} > /etc/built"
            (task / "environment" / "Dockerfile").write_text(
                f"FROM {BASE_IMAGE}\nWORKDIR /app\n{run}\n"
            )
        result = await run_batch_on_ray(
            root,
            address=world.cluster.address,
            harness="oracle",
            sandbox="docker",
            samples=2,
            batch="images-4",
            db=world.db,
        )
        assert {r.status for r in result.results} == {RolloutStatus.SUCCEEDED}
        loaded = {t.id: t for t in load_tasks(root)}
        built = [
            await provider.run(provider.raw.inspect_image, await provider.task_image(t))
            for t in loaded.values()
        ]
        async with opened_store(world.db) as store:
            views = await store.rollouts(batch="images-4")
    finally:
        await provider.close()
    # Docker writes nanoseconds; datetime takes microseconds.
    created = [datetime.fromisoformat(b["Created"][:26] + "+00:00") for b in built]
    started = [v.started_at for v in views if v.started_at is not None]
    assert len(started) == 4
    # Built on the nodes before any rollout started; built lazily, the quick task's rollouts
    # would start while the slow image was still building.
    assert max(created) < min(started), (created, started)


def _sleepers(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if marker in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found


async def test_a_lost_node_s_rollouts_are_retried_elsewhere_as_new_attempts(
    world: RayWorld,
) -> None:
    marker = f"sleep 1.{os.getpid()}"  # a command line only this test's rollouts have
    tasks = _tasks(
        world.tmp / "slow.jsonl",
        9,
        solution=f"{marker}; echo done > answer.txt",
        test="grep -q done answer.txt",
    )
    batch = asyncio.ensure_future(
        run_batch_on_ray(
            tasks,
            address=world.cluster.address,
            harness="oracle",
            sandbox="bwrap",
            batch="slow-9",
            db=world.db,
        )
    )
    victim = world.cluster.list_all_nodes()[1]
    async with opened_store(world.db) as store:
        # Kill the node once its rollouts are under way there.
        for _ in range(600):
            views = await store.rollouts(batch="slow-9")
            if any(v.meta.get(NODE) == victim.node_id and v.meta.get("run") for v in views):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("no rollout ever started on the victim node")
        await asyncio.sleep(0.3)
        victim.kill_raylet()
        result = await asyncio.wait_for(batch, 180)

        views = await store.rollouts(batch="slow-9")
    assert result.summary.rollouts == 9
    assert {r.status for r in result.results} == {RolloutStatus.SUCCEEDED}
    retried = [v for v in views if v.attempt > 0]
    assert retried, "no rollout was on the lost node"
    # The lost attempts are kept, cancelled, each pointing to the attempt that replaced it.
    lost = [v for v in views if v.meta.get("superseded_by")]
    assert len(lost) == len(retried)
    assert {v.status for v in lost} == {RolloutStatus.CANCELLED}
    # (An attempt Ray had placed there but not yet started has no node.)
    assert {v.meta.get(NODE) for v in lost} <= {victim.node_id, None}
    assert all(v.meta[NODE] != victim.node_id for v in retried)
    # One current attempt per sample, and it succeeded.
    current = {(v.task_id, v.sample_index) for v in views if not v.meta.get("superseded_by")}
    assert len(current) == 9
    # Nothing of the lost node's sandboxes runs on.
    for _ in range(100):
        if not _sleepers(marker):
            break
        await asyncio.sleep(0.1)
    assert not _sleepers(marker)
