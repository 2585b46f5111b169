"""rolltap's weight updates reach each engine's own RL control plane, judged by the engine's
own code.

vLLM: the backend answers its control routes through vLLM 0.33's real routers
(vllm/entrypoints/rl/online/api_router.py and serve/dev/cache, mounted in FastAPI around a stub
engine client: tests/support/vllm_plane.py). vLLM's route code parses every query and body
rolltap sends (a wrong one is vLLM's own 422) and calls the engine client; the stub records the
calls in order. SGLang: its http_server.py does not import on CPU (triton), so every control
call rolltap sends an SGLang backend is judged against the source: the route and method it
declares, and the fields of the request struct it parses the body into (io_struct.py).
"""

from __future__ import annotations

import ast
import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow.parquet as pq
import pytest

from rolltap.analysis.reading import rollout_trajectories
from rolltap.export.export import ParquetTrajectoryWriter, write_all
from rolltap.store import CallStatus, Store
from rolltap.store.chain import checksums_digest
from tests.contract import engines
from tests.support import vllm_plane
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import Engine, OpenAIFactory, fake_engine, running_proxy
from tests.support.service import running_service
from tests.support.waiting import until

pytestmark = pytest.mark.contract

MESSAGES = [{"role": "user", "content": "hello"}]
UPDATE_INFO = {
    "names": ["model.norm.weight"],
    "dtype_names": ["bfloat16"],
    "shapes": [[576]],
    "packed": True,
}
"""A trainer's payload for vLLM's /update_weights (its NCCL transfer engine's fields)."""


@pytest.fixture
def routers(vllm: None) -> None:
    reason = vllm_plane.missing()
    if reason is not None:
        pytest.skip(reason)


def _vllm_fake(**options: Any) -> tuple[FakeVLLM, vllm_plane.StubEngine]:
    fake = FakeVLLM(**options)
    app, stub = vllm_plane.vllm_plane(fake)
    fake.vllm_routes = app
    return fake, stub


async def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def _ask(proxy_url: str, store: Store, sdk: OpenAIFactory) -> str:
    created = await store.create_rollout()
    client = sdk(f"{proxy_url}/r/{created.key}/v1", max_retries=0)
    await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    return created.id


def _steps(stub: vllm_plane.StubEngine) -> list[tuple[str, Any]]:
    return [call for call in stub.calls if call[0] != "is_paused"]


async def test_a_drain_update_reaches_vllms_routers_in_order_and_seals_the_weights(
    routers: None, store: Store, sdk: OpenAIFactory
) -> None:
    fake, stub = _vllm_fake()
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, weight_version="1") as proxy,
    ):
        before = await _ask(proxy.url, store, sdk)
        status, began = await _post(f"{proxy.url}/v1/weights/begin", {"mode": "drain"})
        assert (status, began["drained"]) == (200, True)
        status, committed = await _post(f"{proxy.url}/v1/weights/commit", {"version": "2"})
        assert status == 200, committed
        after = await _ask(proxy.url, store, sdk)

    # The trainer pushed the weights itself: the version is set, read back, the engine resumes.
    assert _steps(stub) == [
        ("pause_generation", "wait"),
        ("update_weight_version", "2"),
        ("get_weight_version", None),
        ("compute_weight_checksums", None),
        ("resume_generation", None),
    ]
    digest = checksums_digest(fake.checksums())
    assert committed["weights_digest"] == digest
    (stored,) = await store.weight_checksums("2")
    assert (stored.backend, stored.checksums, stored.digest) == (
        engine.url,
        fake.checksums(),
        digest,
    )
    (old,) = await store.calls(before)
    (new,) = await store.calls(after)
    assert (old.weight_version, old.weights_digest) == ("1", None)
    assert (new.weight_version, new.weights_digest) == ("2", digest)


async def test_update_info_goes_through_vllms_weight_transfer_routes(
    routers: None, store: Store
) -> None:
    """abort_resume pauses with mode=abort; the trainer's update_info reaches vLLM's
    /update_weights as it was given, between start and finish (with the version)."""
    fake, stub = _vllm_fake()
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, weight_version="1") as proxy,
    ):
        await _post(f"{proxy.url}/v1/weights/begin", {"mode": "abort_resume"})
        body = {"version": "3", "update_info": UPDATE_INFO}
        status, committed = await _post(f"{proxy.url}/v1/weights/commit", body)
    assert status == 200, committed
    assert _steps(stub) == [
        ("pause_generation", "abort"),
        ("start_weight_update", None),
        ("update_weights", UPDATE_INFO),
        ("finish_weight_update", "3"),
        ("get_weight_version", None),
        ("compute_weight_checksums", None),
        ("resume_generation", None),
    ]


async def test_an_engine_reporting_another_version_keeps_dispatch_held(
    routers: None, store: Store, sdk: OpenAIFactory
) -> None:
    """The engine took the version but reports another one (it did not take the update): the
    commit fails naming it, calls stay held, and a cancel resumes the engine and the calls on
    the old version."""
    fake, stub = _vllm_fake(reported_version="1")
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, weight_version="1") as proxy,
    ):
        created = await store.create_rollout()
        client = sdk(f"{proxy.url}/r/{created.key}/v1", max_retries=0)
        await _post(f"{proxy.url}/v1/weights/begin", {"mode": "drain"})
        held = asyncio.create_task(client.chat.completions.create(model="m", messages=MESSAGES))  # type: ignore[arg-type]
        await until(lambda: proxy.ctx.hold.waiting == 1)
        status, failed = await _post(f"{proxy.url}/v1/weights/commit", {"version": "2"})
        assert status == 502
        assert failed["error"]["code"] == "weight_version_mismatch"
        assert engine.url in failed["error"]["message"]
        assert "reports weight version '1', not '2'" in failed["error"]["message"]
        await asyncio.sleep(0.2)
        assert not held.done()
        assert proxy.ctx.hold.paused
        assert ("resume_generation", None) not in stub.calls

        status, cancelled = await _post(f"{proxy.url}/v1/weights/cancel", {})
        assert (status, cancelled["weight_version"]) == (200, "1")
        answer = await held
    assert stub.calls[-1] == ("resume_generation", None)
    assert answer.choices[0].message.content
    (call,) = await store.calls(created.id)
    assert (call.status, call.weight_version) == (CallStatus.OK, "1")


async def test_an_update_through_the_service_reaches_vllms_routers(
    routers: None, store: Store, tmp_path: Path
) -> None:
    fake, stub = _vllm_fake()
    async with (
        fake_engine(fake) as engine,
        running_service(store, engine.url, logs=tmp_path / "logs", weight_version="1") as service,
    ):
        async with service.client.weight_update("2", update_info=UPDATE_INFO) as update:
            assert update.began["drained"] is True
        assert update.committed is not None
        assert update.committed["weight_version"] == "2"
    assert [name for name, _ in _steps(stub)] == [
        "pause_generation",
        "start_weight_update",
        "update_weights",
        "finish_weight_update",
        "get_weight_version",
        "compute_weight_checksums",
        "resume_generation",
    ]
    assert ("update_weights", UPDATE_INFO) in stub.calls


async def _stream(proxy_url: str, key: str, sdk: OpenAIFactory) -> str:
    client = sdk(f"{proxy_url}/r/{key}/v1", max_retries=0)
    parts: list[str] = []
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    async for chunk in stream:
        parts += [c.delta.content or "" for c in chunk.choices]
    return "".join(parts)


ANSWER = "an answer long enough to be frozen by an update half way through it"


async def test_an_in_place_update_records_which_version_sampled_which_tokens(
    routers: None, store: Store, sdk: OpenAIFactory, tmp_path: Path
) -> None:
    """vLLM's pause mode=keep freezes a streamed answer mid-way; after the commit it goes on
    under the new weights: the call records the engine's spans, the trajectory places them in
    response_ids, and the Parquet export carries them."""
    # The engine was started under the proxy's first label, as `serve --weight-version` says.
    fake, stub = _vllm_fake(
        script=lambda body: Reply(text=ANSWER, token_delay=0.01), weight_version="1"
    )
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, weight_version="1") as proxy,
    ):
        created = await store.create_rollout()
        asking = asyncio.create_task(_stream(proxy.url, created.key, sdk))
        await until(lambda: proxy.ctx.hold.inflight == 1)
        await asyncio.sleep(0.15)
        status, began = await _post(f"{proxy.url}/v1/weights/begin", {"mode": "in_place"})
        assert status == 200, began
        assert began["update"] == {"mode": "in_place"}
        await asyncio.sleep(0.1)
        assert not asking.done(), "the answer stays frozen through the update"
        status, committed = await _post(f"{proxy.url}/v1/weights/commit", {"version": "2"})
        assert status == 200, committed
        text = await asking

    assert text == ANSWER
    assert stub.calls[0] == ("pause_generation", "keep")
    (call,) = await store.calls(created.id)
    assert call.weight_version == "1"  # dispatched under it: staleness counts from the oldest
    spans = call.weight_spans
    assert spans is not None
    ((v1, a1, b1), (v2, a2, b2)) = spans["0"]
    n = call.completion_tokens
    assert (v1, a1, v2, b2) == ("1", 0, "2", n)
    assert 0 < b1 == a2 < n

    (t,) = (await rollout_trajectories(store, created.id)).trajectories
    assert (t.min_version, t.max_version) == ("1", "2")
    assert [v for v, _, _ in t.weight_spans] == ["1", "2"]
    assert t.weight_spans[0][2] - t.weight_spans[0][1] == b1
    assert t.weight_spans[-1][2] == len(t.response_ids)

    out = tmp_path / "spans.parquet"
    writer = ParquetTrajectoryWriter(out)
    write_all([await rollout_trajectories(store, created.id)], writer)
    writer.close()
    (row,) = pq.read_table(out).to_pylist()
    exported = [(s["version"], s["start"], s["end"]) for s in row["weight_spans"]]
    assert exported == [tuple(s) for s in t.weight_spans]


async def test_an_engine_that_cannot_freeze_fails_an_in_place_begin_and_holds_nothing(
    routers: None, store: Store
) -> None:
    fake, _stub = _vllm_fake(refuse_keep=True)
    async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
        status, failed = await _post(f"{proxy.url}/v1/weights/begin", {"mode": "in_place"})
        assert status == 502
        assert failed["error"]["code"] == "pause_failed"
        assert engine.url in failed["error"]["message"]
        assert not proxy.ctx.hold.paused
        assert proxy.ctx.hold.update is None


# -- SGLang, against its source -------------------------------------------------------------

_SGLANG_STRUCTS = {
    "/pause_generation": "PauseGenerationReqInput",
    "/continue_generation": "ContinueGenerationReqInput",
    "/update_weight_version": "UpdateWeightVersionReqInput",
    "/update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
    "/weights_checker": "CheckWeightsReqInput",
}


def _sglang_routes(sglang: engines.SGLang) -> dict[str, set[str]]:
    """Path -> the methods sglang/srt/entrypoints/http_server.py declares for it."""
    source = (sglang.root / "srt" / "entrypoints" / "http_server.py").read_text()
    routes: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            if not (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute)):
                continue
            if not deco.args or not isinstance(deco.args[0], ast.Constant):
                continue
            path, verb = str(deco.args[0].value), deco.func.attr
            if verb in ("get", "post"):
                routes.setdefault(path, set()).add(verb.upper())
            elif verb == "api_route":
                for kw in deco.keywords:
                    if kw.arg == "methods" and isinstance(kw.value, ast.List):
                        methods = {str(ast.literal_eval(m)) for m in kw.value.elts}
                        routes.setdefault(path, set()).update(methods)
    return routes


def _required(sglang: engines.SGLang, name: str) -> set[str]:
    """The struct's fields without a default (its msgspec constructor requires them)."""
    path = sglang.root / "srt" / "managers" / "io_struct.py"
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and not s.value
            }
    raise AssertionError(f"SGLang has no {name}")


def _pause_modes(sglang: engines.SGLang) -> set[str]:
    text = (sglang.root / "srt" / "managers" / "io_struct.py").read_text()
    found = re.search(r"class PauseGenerationReqInput.*?mode: Literal\[([^\]]*)\]", text, re.S)
    assert found is not None
    return {m.strip().strip('"') for m in found.group(1).split(",")}


@pytest.fixture
async def sglang_engine() -> AsyncIterator[Engine]:
    async with fake_engine(FakeVLLM(sglang=True)) as engine:
        yield engine


async def test_sglang_updates_send_what_its_routes_take_in_order(
    sglang: engines.SGLang, store: Store, sglang_engine: Engine
) -> None:
    fake = sglang_engine.fake
    async with running_proxy(store, f"sglang={sglang_engine.url}", weight_version="1") as proxy:
        for begin, commit in [
            ({"mode": "in_place"}, {"version": "2"}),
            ({"mode": "drain"}, {"version": "3", "update_info": {
                "names": ["model.norm.weight"], "dtypes": ["bfloat16"], "shapes": [[576]],
            }}),
        ]:  # fmt: skip
            status, began = await _post(f"{proxy.url}/v1/weights/begin", begin)
            assert status == 200, began
            status, committed = await _post(f"{proxy.url}/v1/weights/commit", commit)
            assert status == 200, committed
    assert [call for call, _ in fake.planes] == [
        "POST /pause_generation",
        "POST /update_weight_version",
        "GET /model_info",
        "POST /weights_checker",
        "POST /continue_generation",
        "POST /pause_generation",  # drain: once nothing runs
        "POST /update_weights_from_distributed",
        "GET /model_info",
        "POST /weights_checker",
        "POST /continue_generation",
    ]
    routes = _sglang_routes(sglang)
    problems: list[str] = []
    for call, body in fake.planes:
        method, path = call.split(" ")
        if method not in routes.get(path, set()):
            problems.append(f"SGLang declares no {method} {path}")
        struct = _SGLANG_STRUCTS.get(path)
        if struct is None:
            continue
        fields = sglang.dataclass_fields("sglang.srt.managers.io_struct", struct)
        problems += [f"{path}: {struct} has no field {k!r}" for k in sorted(set(body) - fields)]
        problems += [f"{path}: {struct} needs {k!r}" for k in _required(sglang, struct) - set(body)]
        if path == "/pause_generation" and body["mode"] not in _pause_modes(sglang):
            problems.append(f"{path}: SGLang has no pause mode {body['mode']!r}")
    assert problems == []
    # The struct's own default aborts every running request: rolltap never lets it.
    versions = [b for c, b in fake.planes if c == "POST /update_weight_version"]
    assert versions == [{"new_version": "2", "abort_all_requests": False}]
    assert fake.weight_version == "3"


STREAMING_HARNESS = """
python3 - <<'PY'
import json, os, urllib.request

body = {"model": os.environ["ROLLTAP_MODEL"], "stream": True,
        "messages": [{"role": "user", "content": "talk"}]}
request = urllib.request.Request(
    os.environ["ROLLTAP_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json",
             "Authorization": "Bearer " + os.environ["ROLLTAP_KEY"]})
text = ""
with urllib.request.urlopen(request, timeout=120) as response:
    for line in response:
        line = line.strip()
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text += choice["delta"].get("content") or ""
open("answer.txt", "w").write(text)
PY
"""


async def test_an_in_place_update_reaches_the_trainer_with_both_versions_spans(
    routers: None, store: Store, tmp_path: Path
) -> None:
    """A harness's streamed answer frozen by an in_place update mid-batch: the group the
    trainer gets says which version sampled which of its tokens."""
    fake, stub = _vllm_fake(
        script=lambda body: Reply(text=ANSWER, token_delay=0.02), weight_version="1"
    )
    tasks = [{"id": "t0", "instruction": "talk", "test": "grep -q frozen answer.txt"}]
    async with (
        fake_engine(fake) as engine,
        running_service(
            store,
            engine.url,
            logs=tmp_path / "logs",
            scripts={"streaming": STREAMING_HARNESS},
            weight_version="1",
        ) as service,
    ):
        client = service.client
        batch = await client.submit(tasks, harness="streaming", batch_id="in-place")
        await until(lambda: service.proxy.ctx.hold.inflight == 1, "the answer is streaming")
        await asyncio.sleep(0.3)
        async with client.weight_update("2", mode="in_place") as update:
            assert update.began["update"] == {"mode": "in_place"}
        groups = [g async for g in client.groups(batch.id)]

    assert stub.calls[0] == ("pause_generation", "keep")
    ((sample,),) = [g.samples for g in groups]
    assert sample.reward == 1.0
    (t,) = sample.trajectories
    assert (t.min_version, t.max_version) == ("1", "2")
    assert [span[0] for span in t.weight_spans] == ["1", "2"]
    assert t.weight_spans[-1][2] == len(t.response_ids)
