"""What runs on each Ray node of a batch: its proxy, its sandbox provider, its rollouts.

One `NodeAgent` per node (a Ray actor pinned to it) opens a store on the shared PostgreSQL
database, starts a proxy there whose unix socket only this node's sandboxes reach (a replica of
every other node's proxy: proxy/control/replicated.py), and runs each rollout Ray hands it through
the
usual pipeline (runner/rollout.py): sandbox, forwarder, harness, verifier, all on this node.
Before it takes any rollout it builds the images of the batch's tasks (prebuild.py).
Its INIT/RUN/EVAL pools are as wide as the node's `sandbox` resource, the cap Ray schedules by.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import platformdirs

from ...proxy.tokenin.options import TokenInOptions
from ...store import Store
from ...store.spill import spill_root
from ..harnesses import adapter
from ..host import proxy_host
from ..plan import Planned
from ..rollout import Pools, RolloutResult
from ..sandboxes.kinds import make_provider
from ..service.executor import LocalHost, RolloutExecutor, local_executors
from ..service.spec import BatchSpec
from ..tasks import Task
from .prebuild import prebuild

T = TypeVar("T")

NODE = "ray_node"
"""rollout.meta key: the Ray node id the attempt ran on."""


@dataclass(frozen=True)
class NodeSetup:
    """Everything a node needs to run a batch's rollouts (sent to every node, so picklable)."""

    db_url: str
    batch_id: str
    spec: BatchSpec
    """The batch as a node runs it: its harness, sandbox kind, budgets and retries. `retries` are
    infrastructure retries on the node itself (a sandbox that did not start); a lost node is the
    driver's to retry (runner/cluster/dispatch.py)."""
    backends: tuple[str, ...]
    model: str | None
    needs_model: bool
    sandbox_image: str | None = None
    logs_root: Path | None = None
    task_hashes: dict[str, str] = field(default_factory=dict)
    token_in: TokenInOptions | None = None
    """The node's proxy's token-in parsers (the rollouts choose token-in in their meta)."""
    tasks: tuple[Task, ...] = ()
    """The batch's tasks still to run: their images are built on each node before it starts
    rollouts (prebuild.py)."""


class NodeAgent:
    """A threaded Ray actor class (dispatch.py wraps it): `open` once, `run` per rollout (up to
    the node's cap at once), `close`.

    Its work runs on an event loop of its own, in a thread: a stdlib loop, because sandboxes
    start as the sandbox user, which uvloop's subprocesses (Ray's async actors') cannot do.
    """

    def __init__(self, setup: NodeSetup, cap: int, node: str) -> None:
        self._setup = setup
        self._node = node
        self._cap = cap
        self._stack = contextlib.AsyncExitStack()
        self._store: Store | None = None
        self._executor: RolloutExecutor | None = None
        # Ray's worker installs uvloop's policy; this worker process is the agent's alone.
        asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rolltap-node", daemon=True
        )
        self._thread.start()

    def open(self) -> str:
        """Start this node's store, proxy and sandbox provider; the model harnesses ask for."""
        return self._call(self._open())

    def run(self, planned: Planned) -> RolloutResult:
        return self._call(self._run(planned))

    def close(self) -> None:
        try:
            self._call(self._stack.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _call(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    async def _open(self) -> str:
        setup, stack, spec = self._setup, self._stack, self._setup.spec
        store = self._store = await Store.connect(setup.db_url, spill=spill_root())
        stack.push_async_callback(store.close)
        host = await stack.enter_async_context(
            proxy_host(
                store,
                backends=setup.backends,
                model=setup.model,
                needs_model=setup.needs_model,
                token_in=setup.token_in,
            )
        )
        provider = await make_provider(spec.sandbox, image=setup.sandbox_image)
        stack.push_async_callback(provider.close)
        if setup.sandbox_image is None:
            await prebuild(provider, setup.tasks)
        node = LocalHost(
            store=store,
            proxy_socket=host.socket,
            model=lambda: host.model,
            logs_root=setup.logs_root or platformdirs.user_data_path("rolltap") / "runs",
            pools=Pools.sized(self._cap, self._cap, self._cap),
            harnesses={spec.harness: adapter(spec.harness)},
            sandbox_image=setup.sandbox_image,
            # The executor sweeps what a rollout left on this node as the batch ends.
            providers={spec.sandbox: lambda: contextlib.nullcontext(provider)},
            revoke_key=host.revoke,
            harness_from="host",
            task_hashes=setup.task_hashes,
        )
        opened = local_executors(node)(spec, setup.batch_id)
        self._executor = await stack.enter_async_context(opened)
        return host.model

    async def _run(self, planned: Planned) -> RolloutResult:
        store, executor = self._store, self._executor
        assert store is not None, "open() first"
        assert executor is not None, "open() first"
        # Which node ran it: where its logs are, and what to look at when a node misbehaves.
        await store.update_rollout(planned.rollout_id, merge_meta={NODE: self._node})
        return await executor.run(planned)
