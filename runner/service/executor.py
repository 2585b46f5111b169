"""Where a rollout runs: the seam between the service's scheduling and the machines.

`RolloutExecutor.run` takes a planned rollout (its row is in the store, with its key) to its end
and records the result there. Cancelling the task that awaits it must stop the rollout and
leave no sandbox or process behind. `LocalExecutor` runs rollouts in this process's sandboxes
through `rolltap.runner.rollout`; `runner/cluster/service.py` runs them on a Ray cluster.
Every batch goes through this seam: the service's, `rolltap run`'s (runner/batch.py) and each
Ray node's share of one (runner/cluster/node.py); `local_executors` is the one place that
builds a batch's `Shared`.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from ...analysis.hacks import Detector
from ...store import Store
from ...store.ids import new_id
from ..egress import EgressMode, EgressSettings, egress_gate
from ..harnesses import (
    Harness,
    Installation,
    NotInstalled,
    image_installation,
    install,
    installation,
)
from ..harnesses.base import BuiltIn
from ..harnesses.images import build_context, host_ca_bundle
from ..lease import sandbox_run_id
from ..plan import Planned
from ..provenance import harness_metadata
from ..rollout import BatchProgress, BuildsHarnessImages, Pools, RolloutResult, Shared, run_rollout
from ..sandboxes.base import SandboxProvider
from ..sandboxes.kinds import make_provider
from .spec import BatchSpec


class RolloutExecutor(Protocol):
    async def run(self, planned: Planned) -> RolloutResult: ...


ProviderOpener = Callable[[], contextlib.AbstractAsyncContextManager[SandboxProvider]]
"""Opens a sandbox provider for one batch (tests hand the service one of their own)."""

ExecutorFactory = Callable[
    [BatchSpec, str], contextlib.AbstractAsyncContextManager[RolloutExecutor]
]
"""(spec, batch id) -> an executor for that batch, open while the batch runs."""


@dataclass
class LocalHost:
    """What every batch run in this process shares."""

    store: Store
    proxy_socket: Path
    model: Callable[[], str]
    """The served model name harnesses ask for (known once a backend answered)."""
    logs_root: Path
    pools: Pools
    """INIT/RUN/EVAL slots shared by every batch that sets no pools of its own."""
    harnesses: Mapping[str, Harness]
    installations: Mapping[str, Installation] = field(default_factory=dict)
    """Ready installations by harness name; others come from `rolltap harness install`."""
    sandbox_image: str | None = None
    providers: Mapping[str, ProviderOpener] = field(default_factory=dict)
    """Sandbox providers by kind, instead of `make_provider(kind)`."""
    revoke_key: Callable[[str], None] | None = None
    """Refuses a rollout key at once in the proxy of this process (when it is one); the store's
    `key_revoked_at` reaches a proxy elsewhere on its next read of the rollout."""
    egress: EgressSettings = field(default_factory=EgressSettings)
    """The server's egress config (allow-list, intercept hosts, [resolve], upstream CA); a batch
    chooses the mode and adds hosts to the allow-list."""
    harness_from: str = "auto"
    """auto: a harness not in `installations` runs from harness_images/NAME built on the task's
    image in docker, else from its host install; host: always its host install; image: always
    the image."""
    logs_per_batch: bool = True
    """Each batch's logs in logs_root/BATCH; False: in logs_root itself (run_batch's logs_root)."""
    prune_git: bool = True
    """False: keep each task's git history beyond its base commit (runner/guard.py)."""
    detectors: Sequence[Detector] | None = None
    """The reward-hack detectors (analysis/hacks.py); None: `load_detectors()`."""
    progress: BatchProgress | None = None
    """The counters a display reads, when this host runs one batch (`rolltap run`); None: fresh
    ones per batch."""
    task_hashes: Mapping[str, str] = field(default_factory=dict)
    """Content hashes of tasks by id, computed ahead; a rollout hashes any other task itself."""
    run_token: str | None = None
    """What this run's sandboxes of a batch carry beside the batch id (runner/lease.py: the
    batch lease's token); None: a fresh one per batch. Sweeps touch only what carries it."""
    leftovers: tuple[str, ...] = ()
    """Sandbox run ids of a gone holder of the batch, swept when the batch opens."""


class LocalExecutor:
    def __init__(self, shared: Shared) -> None:
        self._shared = shared

    async def run(self, planned: Planned) -> RolloutResult:
        return await run_rollout(self._shared, planned)


def local_executors(host: LocalHost) -> ExecutorFactory:
    @contextlib.asynccontextmanager
    async def open_executor(spec: BatchSpec, batch_id: str) -> AsyncIterator[RolloutExecutor]:
        harness = host.harnesses[spec.harness]
        async with contextlib.AsyncExitStack() as stack:
            opener = host.providers.get(spec.sandbox)
            if opener is not None:
                provider = await stack.enter_async_context(opener())
            else:
                provider = await make_provider(spec.sandbox, image=host.sandbox_image)
                stack.push_async_callback(provider.close)
            # This run's sandboxes carry its own token, not the batch id alone: another run of
            # the same batch name (another store, or the next run here) never sweeps them.
            run_id = sandbox_run_id(batch_id, host.run_token or new_id())
            # Whatever a rollout of this run left behind goes when the batch ends, whatever
            # way it ends (a cancelled INIT may not have got to closing its sandbox).
            stack.push_async_callback(provider.sweep, run_id)
            builtin = isinstance(harness.packages, BuiltIn)
            images = not builtin and _from_image(host, provider.kind, spec.harness)
            image_context = None
            if images:
                if not isinstance(provider, BuildsHarnessImages):
                    raise ValueError(
                        f"the {provider.kind} sandbox cannot build harness images; use host"
                    )
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="rolltap-img-"))
                image_context = build_context(harness, Path(tmp), host_ca_bundle())
                installed = image_installation(harness)
            else:
                installed = await _installed(harness, host.installations)
            for gone in host.leftovers:
                await provider.sweep(gone)
            installed_from = "builtin" if builtin else "image" if images else "host"
            settings: dict[str, Any] = {
                "model": host.model(),
                "max_steps": spec.budgets.max_steps,
                "timeout": spec.budgets.timeout,
            }
            gate = None
            if spec.egress is not EgressMode.NONE:
                egress = replace(
                    host.egress, mode=spec.egress, allow=(*host.egress.allow, *spec.egress_allow)
                )
                gate = await stack.enter_async_context(
                    egress_gate(
                        egress,
                        directory=host.proxy_socket.parent,
                        proxy_socket=host.proxy_socket,
                        store=host.store,
                    )
                )
                settings["egress"] = {"mode": egress.mode.value, "allow": list(egress.allow)}
            sizes = spec.pools
            shared = Shared(
                store=host.store,
                provider=provider,
                harness=harness,
                installation=installed,
                pools=host.pools
                if sizes is None
                else Pools.sized(sizes.init, sizes.run, sizes.eval),
                run_id=run_id,
                proxy_socket=host.proxy_socket,
                model=host.model(),
                logs_root=host.logs_root / batch_id if host.logs_per_batch else host.logs_root,
                timeout=spec.budgets.timeout,
                max_steps=spec.budgets.max_steps,
                retries=spec.retries,
                progress=BatchProgress(total=len(spec.tasks) * spec.samples_per_task)
                if host.progress is None
                else host.progress,
                sandbox_kind=provider.kind,
                image=host.sandbox_image,
                image_context=image_context,
                run_meta=harness_metadata(harness, installed_from, settings),
                task_hashes=dict(host.task_hashes),
                revoke_key=host.revoke_key,
                egress=gate,
                prune_git=host.prune_git,
                detectors=host.detectors,
            )
            yield LocalExecutor(shared)

    return open_executor


def _from_image(host: LocalHost, kind: str, harness: str) -> bool:
    if host.harness_from == "auto":
        return kind == "docker" and harness not in host.installations
    return host.harness_from == "image"


async def _installed(harness: Harness, ready: Mapping[str, Installation]) -> Installation:
    found = ready.get(harness.name)
    if found is not None:
        return found
    try:
        return installation(harness)
    except NotInstalled:
        await asyncio.to_thread(install, harness)
        return installation(harness)
