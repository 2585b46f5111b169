"""The trainer's side of the rollout service (`rolltap serve --runner`): submit batches, take
complete groups as they finish, update weights between batches, cancel.

    from rolltap.client import Client

    client = Client("http://127.0.0.1:8100")         # token: ROLLTAP_ADMIN_TOKEN
    batch = client.submit("/data/tasks", harness="mini-swe-agent", samples_per_task=8,
                          keep="informative", target_groups=32)
    for group in client.groups(batch.id):               # as each group completes
        train_on(group)                                 # group.samples[i].trajectories[j]
    with client.weight_update("13", model_path="/ckpt/13"):
        pass                                            # calls wait; none fails

`AsyncClient` is the same API for asyncio code; `Client` runs it on a private event-loop
thread. A group's arrays are numpy views of what came over the wire (`rolltap.wire`); field
names follow `rolltap.analysis.trajectory.Trajectory`, and `rolltap.trainers` turns groups into
what verl, SkyRL and slime consume.

Errors: `ServiceError` (the service answered an error: `status`, `code`, `message`), and
`aiohttp.ClientError` when it cannot be reached. `submit` retries a lost connection with the
same idempotency key, so a batch is never launched twice; `groups` reconnects its event stream
from the last event it saw.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import orjson

from rolltap import wire

from .loop_thread import LoopThread

if TYPE_CHECKING:
    # Imported where a request is made: `import rolltap.client` stays cheap for a trainer that
    # only loads it (aiohttp alone is more than half of the import; bench/cli_bench.py).
    import aiohttp

__all__ = [
    "AsyncClient",
    "Batch",
    "Client",
    "Dropped",
    "Group",
    "Sample",
    "ServiceError",
    "Trajectory",
    "Turn",
    "WeightUpdate",
]

DEFAULT_URL = "http://127.0.0.1:8100"
TOKEN_ENV = "ROLLTAP_ADMIN_TOKEN"


class ServiceError(Exception):
    """The service refused or failed a request; `code` is its machine-readable reason."""

    def __init__(self, status: int, message: str, code: str | None, body: Any = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.code = code
        self.body = body


@dataclass(frozen=True)
class Turn:
    """An answer (the tokens one call sampled) or an observation (what came back between two
    answers), as a span [start, end) of `Trajectory.response_ids`."""

    kind: str
    start: int
    end: int
    call_id: str | None = None
    weight_version: str | None = None
    token_hash: str | None = None
    """An observation's stable hash of its token ids (equal observations, equal hashes)."""


@dataclass(frozen=True)
class Trajectory:
    """One token-faithful segment of a rollout (see rolltap.analysis.trajectory for every field)."""

    rollout_id: str
    segment: int
    role: str
    prompt_ids: npt.NDArray[np.int32]
    response_ids: npt.NDArray[np.int32]
    loss_mask: npt.NDArray[np.uint8]
    logprobs: npt.NDArray[np.float32]
    has_logprobs: bool
    finish_reason: str | None
    sampled_tokens: int
    lost_tokens: int
    prompt_hash: str
    min_version: str | None
    max_version: str | None
    call_ids: list[str]
    weight_versions: list[str | None]
    turns: list[Turn]
    link: dict[str, Any] | None
    """Which earlier segment this one branched from, and the drift class of the break."""
    routed_experts: npt.NDArray[Any] | None = None
    """The MoE experts each token of prompt_ids + response_ids was routed to (R3), n_tokens - 1
    rows of layers x top-k (SGLang: layers * top-k); None when not captured."""
    weight_spans: list[list[Any]] = field(default_factory=list)
    """Which version sampled which tokens: [version, start, end] over response_ids, one per
    answer, more where an answer went on across an in_place weight update."""

    @property
    def observation_hashes(self) -> list[str]:
        return [t.token_hash for t in self.turns if t.token_hash is not None]


@dataclass(frozen=True)
class Sample:
    """One rollout of the group's task (its current attempt) and its trajectories."""

    rollout_id: str
    sample_index: int
    attempt: int
    status: str
    reward: float | None
    error: str | None
    min_version: str | None
    max_version: str | None
    staleness: int | None
    """Weight updates since its oldest call was sampled."""
    stale: bool
    faithfulness: float
    breaks: dict[str, int]
    n_calls: int
    n_tokens: int
    trajectories: list[Trajectory] = field(default_factory=list)
    stale_action: str | None = None
    """What the batch's bound did when the proxy found this rollout past it at a dispatch:
    "flag" (its calls went on), or None."""
    relaunch_of: str | None = None
    """The attempt this one replaces, stopped for staleness (`stale: "relaunch"`)."""
    verdict: str = "unverified"
    """Whether the task passed, from the reward: passed, partial, failed or unverified
    (`status` says only how the run ended)."""
    hack_flags: list[dict[str, Any]] | None = None
    """What the reward-hack detectors flagged in its record (None: never checked); with the
    batch's `on_hack: "zero_reward"` its `reward` is 0."""


@dataclass(frozen=True)
class Group:
    """Every sample of one task: what GRPO normalizes rewards over."""

    batch_id: str
    group_id: str
    seq: int
    task_id: str
    informative: bool
    stale: bool
    rewards: list[float | None]
    policy_version: str | None
    labels: dict[str, Any]
    samples: list[Sample]
    hacked: bool = False
    """A sample of it was flagged by the reward-hack detectors (`on_hack` says what followed)."""

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for s in self.samples for t in s.trajectories]


@dataclass(frozen=True)
class Dropped:
    """A complete group the batch did not keep (`reason`: uninformative, stale or hacked)."""

    seq: int
    task_id: str
    reason: str
    rewards: list[float | None]


@dataclass(frozen=True)
class Batch:
    """A batch as the service reported it when asked (`status`, counts, pass@k so far)."""

    id: str
    status: str
    created: bool
    """This submission launched it (False: the id or key named a batch already there)."""
    data: dict[str, Any]

    @property
    def done(self) -> bool:
        return self.status != "running"


@dataclass
class WeightUpdate:
    """An update under way: `began` is the service's answer to begin, `committed` to commit."""

    version: str
    mode: str
    began: dict[str, Any]
    committed: dict[str, Any] | None = None


def parse_group(message: Mapping[str, Any]) -> Group:
    """A group message of the service (either encoding) as typed data with numpy arrays."""
    if message.get("encoding") == "arrow":
        rows = wire.rows_from_arrow(base64.b64decode(message["arrow"]))
    else:
        rows = [wire.row_from_json(r) for r in message.get("trajectories", [])]
    by_rollout: dict[str, list[Trajectory]] = {}
    for row in rows:
        turns = [Turn(**t) for t in row.pop("turns")]
        by_rollout.setdefault(row["rollout_id"], []).append(Trajectory(**row, turns=turns))
    samples = [
        Sample(**s, trajectories=by_rollout.get(s["rollout_id"], []))
        for s in message.get("samples", [])
    ]
    return Group(
        batch_id=message["batch_id"],
        group_id=message["group_id"],
        seq=message["seq"],
        task_id=message["task_id"],
        informative=message["informative"],
        stale=message["stale"],
        rewards=list(message["rewards"]),
        policy_version=message.get("policy_version"),
        labels=dict(message.get("labels") or {}),
        samples=samples,
        hacked=bool(message.get("hacked", False)),
    )


class AsyncClient:
    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        encoding: str = "base64",
        timeout: float = 60.0,
        reconnects: int = 20,
    ) -> None:
        """`token`: the admin token (default ROLLTAP_ADMIN_TOKEN); `encoding`: base64 or
        arrow, how groups travel (rolltap.wire); `reconnects`: event-stream reconnections in
        a row before `groups` gives up."""
        if encoding not in wire.ENCODINGS:
            raise ValueError(f"encoding must be one of {', '.join(wire.ENCODINGS)}")
        self.url = url.rstrip("/")
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._encoding = encoding
        self._timeout = timeout
        self._reconnects = reconnects
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- batches ------------------------------------------------------------------------------

    async def submit(
        self,
        tasks: str | Path | Sequence[Mapping[str, Any]],
        *,
        harness: str,
        samples_per_task: int = 1,
        sandbox: str | None = None,
        batch_id: str | None = None,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> Batch:
        """Submit a batch. `tasks`: a path on the server (a task directory, a directory of
        them, or a JSONL file) or task objects in the JSONL shorthand. `options` are the other
        fields of POST /v1/batches: budgets, labels, policy_version, sampling, keep,
        target_groups, max_staleness, stale, on_hack, concurrency, pools, retries, egress."""
        body: dict[str, Any] = {
            "tasks": str(tasks) if isinstance(tasks, str | Path) else [dict(t) for t in tasks],
            "harness": harness,
            "samples_per_task": samples_per_task,
            **{k: v for k, v in options.items() if v is not None},
        }
        if sandbox is not None:
            body["sandbox"] = sandbox
        if batch_id is not None:
            body["id"] = batch_id
        key = idempotency_key or (None if batch_id else uuid.uuid4().hex)
        headers = {"Idempotency-Key": key} if key else {}
        import aiohttp

        # The key (or the id) makes a retry after a lost answer return the same batch.
        for attempt in range(4):
            try:
                status, data = await self._request("POST", "/v1/batches", body, headers)
            except (aiohttp.ClientConnectionError, TimeoutError):
                if attempt == 3:
                    raise
                await asyncio.sleep(0.5 * 2**attempt)
                continue
            return Batch(data["id"], data["status"], status == 201, data)
        raise AssertionError("unreachable")

    async def batch(self, batch_id: str) -> Batch:
        _, data = await self._request("GET", f"/v1/batches/{batch_id}")
        return Batch(data["id"], data["status"], False, data)

    async def cancel(self, batch_id: str) -> Batch:
        """Stop the batch: sandboxes killed, unfinished rollouts cancelled, nothing deleted."""
        _, data = await self._request("DELETE", f"/v1/batches/{batch_id}")
        return Batch(data["id"], data["status"], False, data)

    async def groups(self, batch_id: str, *, after: int = 0) -> AsyncIterator[Group]:
        """Kept groups as they complete, until the batch ends."""
        async for event in self.events(batch_id, after=after):
            if isinstance(event, Group):
                yield event

    async def events(
        self, batch_id: str, *, after: int = 0
    ) -> AsyncIterator[Group | Dropped | Batch]:
        """Every event of the batch: kept groups, dropped groups, and finally the batch as it
        ended. Reconnects from the last event seen when the stream breaks."""
        import aiohttp

        last = after
        failures = 0
        while True:
            try:
                async for event_id, kind, data in self._sse(batch_id, last):
                    failures = 0
                    last = event_id
                    if kind == "group":
                        yield parse_group(data)
                    elif kind == "dropped":
                        yield Dropped(data["seq"], data["task_id"], data["reason"], data["rewards"])
                    elif kind == "done":
                        yield Batch(data["id"], data["status"], False, data)
                        return
                return
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError):
                failures += 1
                if failures > self._reconnects:
                    raise
                await asyncio.sleep(min(5.0, 0.2 * 2**failures))

    async def _sse(self, batch_id: str, after: int) -> AsyncIterator[tuple[int, str, Any]]:
        import aiohttp

        headers = {**self._headers, "Accept": "text/event-stream"}
        if after:
            headers["Last-Event-ID"] = str(after)
        url = f"{self.url}/v1/batches/{batch_id}/events?format={self._encoding}"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout)
        async with self._client().get(url, headers=headers, timeout=timeout) as resp:
            if resp.status != 200:
                raise _error(resp.status, await resp.read())
            event_id, kind, data = 0, "message", b""
            async for line in resp.content:
                line = line.rstrip(b"\r\n")
                if not line:
                    if data:
                        yield event_id, kind, orjson.loads(data)
                    kind, data = "message", b""
                elif line.startswith(b"id:"):
                    event_id = int(line[3:].strip())
                elif line.startswith(b"event:"):
                    kind = line[6:].strip().decode()
                elif line.startswith(b"data:"):
                    data += line[5:].lstrip()
            # A stream that ends without `done` broke: the caller reconnects.
            raise aiohttp.ClientPayloadError("the event stream ended before the batch did")

    async def collected(self, batch_id: str, *, after: int = 0, limit: int = 100) -> list[Group]:
        """Kept groups already complete (polling instead of the event stream)."""
        path = f"/v1/batches/{batch_id}/groups?after={after}&limit={limit}&format={self._encoding}"
        _, data = await self._request("GET", path)
        return [parse_group(g) for g in data["groups"]]

    async def post_metrics(
        self,
        batch_id: str,
        metrics: Mapping[str, Any],
        *,
        policy_version: str | None = None,
    ) -> dict[str, Any]:
        """Store the trainer's figures about a batch for `rolltap ui`'s training view: e.g.
        {"logprob_mismatch_max": 2.4e-5, "loss": 0.01, "seconds": {"sample": 41.0, "update":
        2.1}} (numbers, short strings, or one level of numbers; rolltap.runner.service.posted).
        `policy_version`: the version they are about, the batch's by default. Returns the
        stored record."""
        body: dict[str, Any] = {"metrics": dict(metrics)}
        if policy_version is not None:
            body["policy_version"] = policy_version
        _, data = await self._request("POST", f"/v1/batches/{batch_id}/metrics", body)
        return dict(data)

    async def metrics(self, batch_id: str) -> list[dict[str, Any]]:
        """What trainers posted about a batch, oldest first."""
        _, data = await self._request("GET", f"/v1/batches/{batch_id}/metrics")
        return list(data["metrics"])

    # -- weights ------------------------------------------------------------------------------

    async def weights(self) -> dict[str, Any]:
        """The proxy's weight version, its epoch, the update under way, and held calls."""
        _, data = await self._request("GET", "/v1/weights")
        return dict(data)

    async def begin_weight_update(
        self,
        version: str,
        *,
        mode: str = "drain",
        timeout: float = 600.0,
        lease: float | None = None,
    ) -> WeightUpdate:
        """Stop dispatching (see `weight_update`); with `lease`, the proxy cancels the update
        itself if it is neither committed nor cancelled within that many seconds."""
        body: dict[str, Any] = {"mode": mode, "timeout": timeout}
        if lease is not None:
            body["lease"] = lease
        _, began = await self._request("POST", "/v1/weights/begin", body)
        return WeightUpdate(version, mode, began)

    async def commit_weight_update(
        self,
        update: WeightUpdate,
        *,
        model_path: str | Path | None = None,
        load_format: str = "auto",
        update_info: Mapping[str, Any] | Sequence[Any] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"version": update.version}
        if model_path is not None:
            body |= {"model_path": str(model_path), "load_format": load_format}
        if update_info is not None:
            # The engine's own payload (vLLM's WeightTransferUpdatePayload), passed through.
            info = update_info
            body["update_info"] = dict(info) if isinstance(info, Mapping) else list(info)
        _, update.committed = await self._request("POST", "/v1/weights/commit", body)
        return update.committed

    async def cancel_weight_update(self) -> dict[str, Any]:
        _, data = await self._request("POST", "/v1/weights/cancel", {})
        return dict(data)

    @contextlib.asynccontextmanager
    async def weight_update(
        self,
        version: str,
        *,
        mode: str = "drain",
        model_path: str | Path | None = None,
        load_format: str = "auto",
        timeout: float = 600.0,
        lease: float | None = None,
        update_info: Mapping[str, Any] | Sequence[Any] | None = None,
    ) -> AsyncIterator[WeightUpdate]:
        """Hold engine calls for the block (none fails), then give the engines the new weights
        and resume under `version`: `model_path` is loaded, `update_info` is pushed through the
        engine's own weight transfer (vLLM's /update_weights), and without either the trainer
        pushed them itself in the block and only the version is set. If the block raises, the
        update is cancelled and calls resume on the old version. `mode`: drain, abort_resume or
        in_place (proxy/control/weights.py)."""
        import aiohttp

        update = await self.begin_weight_update(version, mode=mode, timeout=timeout, lease=lease)
        try:
            yield update
        except BaseException:
            with contextlib.suppress(ServiceError, aiohttp.ClientError):
                await self.cancel_weight_update()
            raise
        await self.commit_weight_update(
            update, model_path=model_path, load_format=load_format, update_info=update_info
        )

    # -- plumbing -------------------------------------------------------------------------------

    def _client(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, Any]:
        import aiohttp

        data = None if body is None else orjson.dumps(body)
        sent = {**self._headers, **(headers or {})}
        if data is not None:
            sent["Content-Type"] = "application/json"
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None, sock_connect=self._timeout)
        async with self._client().request(
            method, self.url + path, data=data, headers=sent, timeout=timeout
        ) as resp:
            raw = await resp.read()
            if resp.status >= 400:
                raise _error(resp.status, raw)
            return resp.status, orjson.loads(raw)


def _error(status: int, raw: bytes) -> ServiceError:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return ServiceError(status, raw[:300].decode(errors="replace"), None)
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return ServiceError(status, str(error.get("message")), error.get("code"), body)
    return ServiceError(status, raw[:300].decode(errors="replace"), None, body)


async def _close(stream: AsyncIterator[Any]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


class Client:
    """`AsyncClient` for plain (blocking) code: the same methods, run on a private loop."""

    def __init__(self, url: str = DEFAULT_URL, **options: Any) -> None:
        self._loop = LoopThread("rolltap-client")
        self._client = AsyncClient(url, **options)

    def close(self) -> None:
        try:
            self._loop.run(self._client.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def submit(
        self,
        tasks: str | Path | Sequence[Mapping[str, Any]],
        *,
        harness: str,
        samples_per_task: int = 1,
        **options: Any,
    ) -> Batch:
        """See `AsyncClient.submit`."""
        return self._loop.run(
            self._client.submit(
                tasks, harness=harness, samples_per_task=samples_per_task, **options
            )
        )

    def batch(self, batch_id: str) -> Batch:
        return self._loop.run(self._client.batch(batch_id))

    def cancel(self, batch_id: str) -> Batch:
        return self._loop.run(self._client.cancel(batch_id))

    def groups(self, batch_id: str, *, after: int = 0) -> Iterator[Group]:
        """Kept groups as they complete, until the batch ends."""
        for event in self.events(batch_id, after=after):
            if isinstance(event, Group):
                yield event

    def events(self, batch_id: str, *, after: int = 0) -> Iterator[Group | Dropped | Batch]:
        stream = self._client.events(batch_id, after=after)

        async def step() -> Group | Dropped | Batch | None:
            return await anext(stream, None)

        try:
            while (event := self._loop.run(step())) is not None:
                yield event
        finally:
            self._loop.run(_close(stream))

    def collected(self, batch_id: str, *, after: int = 0, limit: int = 100) -> list[Group]:
        return self._loop.run(self._client.collected(batch_id, after=after, limit=limit))

    def post_metrics(
        self,
        batch_id: str,
        metrics: Mapping[str, Any],
        *,
        policy_version: str | None = None,
    ) -> dict[str, Any]:
        """See `AsyncClient.post_metrics`."""
        return self._loop.run(
            self._client.post_metrics(batch_id, metrics, policy_version=policy_version)
        )

    def metrics(self, batch_id: str) -> list[dict[str, Any]]:
        return self._loop.run(self._client.metrics(batch_id))

    def weights(self) -> dict[str, Any]:
        return self._loop.run(self._client.weights())

    @contextlib.contextmanager
    def weight_update(
        self,
        version: str,
        *,
        mode: str = "drain",
        model_path: str | Path | None = None,
        load_format: str = "auto",
        timeout: float = 600.0,
        lease: float | None = None,
        update_info: Mapping[str, Any] | Sequence[Any] | None = None,
    ) -> Iterator[WeightUpdate]:
        """See `AsyncClient.weight_update`."""
        import aiohttp

        update = self._loop.run(
            self._client.begin_weight_update(version, mode=mode, timeout=timeout, lease=lease)
        )
        try:
            yield update
        except BaseException:
            with contextlib.suppress(ServiceError, aiohttp.ClientError):
                self._loop.run(self._client.cancel_weight_update())
            raise
        self._loop.run(
            self._client.commit_weight_update(
                update, model_path=model_path, load_format=load_format, update_info=update_info
            )
        )
