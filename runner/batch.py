"""Run a batch from this process: `rolltap run`, `rolltap run --ray` and `run_batch`.

    result = await rolltap.runner.run_batch("examples/tasks", harness="mini-swe-agent",
                                            sandbox="bwrap", samples=4, concurrency=8)

A batch is the rollout service's `BatchSpec` (runner/service/spec.py, what `POST /v1/batches`
takes) and the `RunOptions` of this process (its proxy, store, harness install). `run_spec`
starts the proxy (or reaches a running one), plans the batch in the store and runs its rollouts
through the service's executor seam (runner/service/executor.py): in this process's sandboxes,
or on a Ray cluster (runner/cluster/service.py). `run_batch` is `run_spec` with keyword
arguments, for scripts and tests.

Rerunning the same batch (same name, or the same tasks, harness, model and sandbox) resumes
it: finished rollouts are kept, unfinished ones get a new attempt; a rerun with other settings
that change the outcome is refused (runner/settings.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import platformdirs

from ..analysis.choice import load_detectors
from ..analysis.hacks import Detector
from ..analysis.reading import analyze_rollout
from ..proxy.replay import Cassette
from ..proxy.tokenin.options import TokenInOptions
from ..store import RolloutStatus, Store
from ..store.events import Cancelled
from ..store.spill import spill_root
from ..store.url import DatabaseURL, resolve_url
from .egress import BadEgressSetting, EgressMode, EgressSettings
from .harnesses import (
    Harness,
    Installation,
    NotInstalled,
    adapter,
    image_installation,
    install,
    installation,
)
from .harnesses.base import BuiltIn
from .harnesses.oracle import NAME as ORACLE
from .host import expected_model, proxy_host, token_in_meta
from .lease import batch_lease
from .plan import plan, to_run
from .provenance import task_hash
from .rollout import BatchProgress, Pools, RolloutResult
from .sandboxes.base import SandboxProvider
from .service.executor import LocalHost, local_executors
from .service.spec import BatchSpec, Budgets, PoolSizes, parse_sampling
from .settings import BatchSettings
from .summary import BatchSummary, current_attempts, summarize
from .tasks import Task, load_tasks


@dataclass(frozen=True)
class BatchResult:
    batch_id: str
    results: list[RolloutResult]
    """The rollouts run this time (resumed batches also keep earlier ones: see summary)."""
    summary: BatchSummary


@dataclass(frozen=True)
class RunOptions:
    """What a batch run from this process needs beyond its spec (`rolltap run`'s other flags)."""

    db: str | DatabaseURL | None = None
    backends: tuple[str, ...] = ()
    """Inference backends ([KIND=]URL); none: the built-in engine."""
    model: str | None = None
    """The served model name; None: what the backend serves."""
    proxy_socket: Path | None = None
    """A running proxy's unix socket (same store) instead of starting one."""
    engine_model: str | None = None
    engine_args: tuple[str, ...] = ()
    max_tokens_cap: int | None = None
    sandbox_image: str | None = None
    harness_from: str = "auto"
    """auto, host (the `rolltap harness install` prefix) or image (harness_images/NAME)."""
    egress: EgressSettings | None = None
    """The run's egress config; the spec's `egress` mode must match it."""
    token_in: TokenInOptions | None = None
    prune_git_history: bool = True
    detectors: tuple[str | Detector, ...] = ()
    """Reward-hack detectors by name or dotted path, or detectors, added to the defaults."""
    logs_root: Path | None = None
    """Where the rollouts' logs go; None: the user data dir's runs/BATCH."""
    ray: str | None = None
    """A Ray cluster's address ("auto": this machine's) to run the rollouts on; None: here."""
    wait: bool = False
    """Another process runs the batch: wait for it to end (`--wait`) instead of refusing."""
    retry_failed: bool = False
    """Rerun every rollout that did not finish, judged failures too (`--retry-failed`)."""


def default_batch_id(
    tasks: str | Path, harness: str, model: str, sandbox: str, samples: int
) -> str:
    """The same command names the same batch, so running it again resumes it."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(str(tasks)).stem)[:40] or "tasks"
    source = f"{Path(str(tasks)).resolve()}|{harness}|{model}|{sandbox}|{samples}"
    return f"{stem}-{harness}-{hashlib.sha256(source.encode()).hexdigest()[:8]}"


def tasks_of(tasks: str | Path | Sequence[Task]) -> tuple[tuple[Task, ...], str]:
    """The tasks to run and their source: the path they were read from, or their ids."""
    if isinstance(tasks, str | Path):
        return tuple(load_tasks(Path(tasks))), str(tasks)
    return tuple(tasks), ",".join(t.id for t in tasks)


async def run_batch(
    tasks: str | Path | Sequence[Task],
    *,
    harness: str | Harness = "mini-swe-agent",
    sandbox: str | SandboxProvider = "bwrap",
    installed: Installation | None = None,
    harness_from: str = "auto",
    samples: int = 1,
    concurrency: int = 4,
    init_concurrency: int | None = None,
    eval_concurrency: int | None = None,
    backends: Sequence[str] = (),
    model: str | None = None,
    batch: str | None = None,
    timeout: float | None = None,
    db: str | DatabaseURL | None = None,
    store: Store | None = None,
    max_calls: int | None = 100,
    max_tokens: int | None = None,
    max_steps: int | None = None,
    sampling: Mapping[str, float | int] | None = None,
    retries: int = 2,
    proxy_socket: Path | None = None,
    engine_model: str | None = None,
    engine_args: Sequence[str] = (),
    max_tokens_cap: int | None = None,
    sandbox_image: str | None = None,
    logs_root: Path | None = None,
    progress: BatchProgress | None = None,
    meta: Mapping[str, Any] | None = None,
    replay: Cassette | None = None,
    egress: EgressSettings | None = None,
    token_in: TokenInOptions | None = None,
    prune_git_history: bool = True,
    detectors: Sequence[str | Detector] | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> BatchResult:
    """Run (or resume) a batch here and return its results and summary: `run_spec` with its
    spec and options as keyword arguments, and a harness or sandbox provider of your own.

    `sampling` is imposed on every engine call of the batch (the spec's `sampling`, checked as
    the service checks it: SpecError, a ValueError);
    `meta` goes into each new rollout's meta; `replay` answers the batch's calls from a
    recorded rollout (runner/replay.py); `egress`: HTTP(S) out of the sandboxes through the
    run's egress gate (runner/egress), recorded with each rollout; `token_in`: the batch's
    rollouts in token-in mode when enabled, and the parsers of the run's own proxy;
    `prune_git_history=False` keeps each task's git history beyond its base commit (runner/
    guard.py); `detectors`: the reward-hack detectors by name or dotted path (analysis/hacks.py),
    or detectors themselves, added to the defaults (`load_detectors`)."""
    loaded, source = tasks_of(tasks)
    spec = BatchSpec(
        tasks=loaded,
        tasks_source=source,
        harness=harness if isinstance(harness, str) else harness.name,
        sandbox=sandbox if isinstance(sandbox, str) else sandbox.kind,
        samples_per_task=samples,
        budgets=Budgets(max_calls, max_tokens, timeout, max_steps),
        concurrency=concurrency,
        pools=PoolSizes(
            init_concurrency or concurrency, concurrency, eval_concurrency or concurrency
        ),
        retries=retries,
        egress=EgressMode.NONE if egress is None else egress.mode,
        id=batch,
        sampling=parse_sampling(None if sampling is None else dict(sampling)),
    )
    options = RunOptions(
        db=db,
        backends=tuple(backends),
        model=model,
        proxy_socket=proxy_socket,
        engine_model=engine_model,
        engine_args=tuple(engine_args),
        max_tokens_cap=max_tokens_cap,
        sandbox_image=sandbox_image,
        harness_from=harness_from,
        egress=egress,
        token_in=token_in,
        prune_git_history=prune_git_history,
        detectors=tuple(detectors or ()),
        logs_root=logs_root,
    )
    return await run_spec(
        spec,
        options,
        harness=None if isinstance(harness, str) else harness,
        sandbox=None if isinstance(sandbox, str) else sandbox,
        installed=installed,
        store=store,
        meta=meta,
        replay=replay,
        progress=progress,
        say=say,
    )


async def run_spec(
    spec: BatchSpec,
    options: RunOptions,
    *,
    harness: Harness | None = None,
    sandbox: SandboxProvider | None = None,
    installed: Installation | None = None,
    store: Store | None = None,
    meta: Mapping[str, Any] | None = None,
    replay: Cassette | None = None,
    progress: BatchProgress | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> BatchResult:
    """Run (or resume) the batch `spec` asks for, here or on the Ray cluster `options.ray`.

    `harness`, `sandbox`, `installed`, `store`: objects of the caller's own, instead of the
    ones `spec` and `options` name; `meta` goes into each new rollout's meta; `replay` answers
    the batch's calls from a recorded rollout (runner/replay.py)."""
    progress = progress or BatchProgress()
    if options.ray is not None:
        return await _on_ray(spec, options, meta, progress, say)
    checkers = _detectors(options.detectors)
    if not spec.tasks:
        raise ValueError("no tasks to run")
    adapter_ = harness or adapter(spec.harness)
    harness_from, kind, egress = options.harness_from, spec.sandbox, _egress(spec, options)
    if harness_from not in ("auto", "host", "image"):
        raise ValueError(f"harness_from={harness_from!r}: use auto, host or image")
    if egress is not None and egress.enabled and kind == "local":
        raise BadEgressSetting("--egress needs an isolated sandbox (bwrap, docker, apptainer)")
    builtin = isinstance(adapter_.packages, BuiltIn)
    needs_model = not builtin and (replay is None or replay.goes_live)
    async with contextlib.AsyncExitStack() as stack:
        if store is None:
            store = await Store.connect(options.db, spill=spill_root())
            stack.push_async_callback(store.close)
        # The batch, its lease and what it still needs come before an engine starts or a
        # harness installs: a busy batch, one with nothing to run and one run with other
        # settings are told in seconds.
        model = await expected_model(
            backends=options.backends,
            model=options.model,
            engine_model=options.engine_model,
            engine_args=options.engine_args,
            needs_model=needs_model,
        )
        batch_id = spec.id or default_batch_id(
            spec.tasks_source, adapter_.name, model, kind, spec.samples_per_task
        )
        held = await stack.enter_async_context(
            batch_lease(store, batch_id, wait=options.wait, say=say)
        )
        settings = _outcome(spec, options, egress, adapter_.name, model)
        pending = await to_run(
            store,
            batch_id,
            list(spec.tasks),
            spec.samples_per_task,
            settings=settings,
            retry_failed=options.retry_failed,
        )
        if pending == 0:
            views = current_attempts(await store.rollouts(batch=batch_id))
            say(f"batch {batch_id}: all {len(views)} rollouts already finished; nothing to run")
            return BatchResult(batch_id, [], summarize(batch_id, views, 0.0))
        images = not builtin and (
            harness_from == "image" or (harness_from == "auto" and kind == "docker")
        )
        if images:
            installed = image_installation(adapter_)
        if installed is None:
            try:
                installed = installation(adapter_)
            except NotInstalled:
                say(f"installing {adapter_.name} (once)...")
                await asyncio.to_thread(install, adapter_, say=say)
                installed = installation(adapter_)
        host = await stack.enter_async_context(
            proxy_host(
                store,
                backends=options.backends,
                model=options.model,
                socket=options.proxy_socket,
                engine_model=options.engine_model,
                engine_args=options.engine_args,
                max_tokens_cap=options.max_tokens_cap,
                needs_model=needs_model,
                replay=replay,
                token_in=options.token_in,
                say=say,
            )
        )
        if host.model != model:
            raise RuntimeError(
                f"the engine serves {host.model!r}, not the {model!r} its flags name: pass --model"
            )
        sizes = spec.pools or PoolSizes(*(spec.concurrency,) * 3)
        here = LocalHost(
            store=store,
            proxy_socket=host.socket,
            model=lambda: host.model,
            logs_root=options.logs_root or platformdirs.user_data_path("rolltap") / "runs",
            logs_per_batch=options.logs_root is None,
            pools=Pools.sized(sizes.init, sizes.run, sizes.eval),
            harnesses={adapter_.name: adapter_},
            installations={} if images else {adapter_.name: installed},
            sandbox_image=options.sandbox_image,
            providers={} if sandbox is None else {kind: lambda: contextlib.nullcontext(sandbox)},
            revoke_key=host.revoke,
            egress=options.egress or EgressSettings(),
            harness_from=harness_from,
            prune_git=options.prune_git_history,
            detectors=checkers,
            progress=progress,
            task_hashes=await asyncio.to_thread(lambda: {t.id: task_hash(t) for t in spec.tasks}),
            run_token=held.token,
            leftovers=held.leftovers,
        )
        executor = await stack.enter_async_context(local_executors(here)(spec, batch_id))
        if egress is not None and egress.enabled:
            say(f"egress: {egress.mode.value}, allow-list {', '.join(egress.allow) or '(empty)'}")
        todo, kept = await plan(
            store,
            batch_id,
            list(spec.tasks),
            spec.samples_per_task,
            harness=adapter_.name,
            model=host.model,
            budgets=spec.budgets,
            meta=_rollout_meta(spec, meta, options.token_in),
            settings=settings,
            retry_failed=options.retry_failed,
        )
        if kept or any(p.attempt > 0 for p in todo):
            say(
                f"resuming batch {batch_id}: {len(kept)} of {len(kept) + len(todo)} rollouts "
                f"already finished, {len(todo)} to run"
            )
        progress.total = len(todo)
        progress.token_count = host.tokens_recorded
        progress.call_count = host.calls_recorded
        started = time.monotonic()
        try:
            results = await asyncio.gather(*(executor.run(p) for p in todo))
        except asyncio.CancelledError:
            await _interrupted(store, [p.rollout_id for p in todo])
            raise
        views = current_attempts(await store.rollouts(batch=batch_id))
        summary = summarize(batch_id, views, time.monotonic() - started)
        return BatchResult(batch_id, list(results), summary)


async def _on_ray(
    spec: BatchSpec,
    options: RunOptions,
    meta: Mapping[str, Any] | None,
    progress: BatchProgress,
    say: Callable[[str], None],
) -> BatchResult:
    """The batch's rollouts on the Ray cluster `options.ray`, planned here in the shared
    PostgreSQL store exactly as a local run plans them (reruns resume)."""
    if not spec.tasks:
        raise ValueError("no tasks to run")
    url = options.db if isinstance(options.db, DatabaseURL) else resolve_url(options.db)
    if url.is_sqlite:
        raise ValueError(
            "a Ray batch's nodes share its store: give a PostgreSQL database "
            "(--db postgresql+asyncpg://USER@HOST/DB)"
        )
    harness, backends = adapter(spec.harness), options.backends
    if harness.name != ORACLE and not backends:
        raise ValueError("a Ray batch needs --backend: the engines every node's proxy reaches")
    model = await expected_model(backends=backends, model=options.model, needs_model=False)
    store = await Store.connect(url.url.render_as_string(hide_password=False))
    try:
        batch_id = spec.id or default_batch_id(
            spec.tasks_source, harness.name, model, spec.sandbox, spec.samples_per_task
        )
        async with batch_lease(store, batch_id, wait=options.wait, say=say):
            return await _dispatch_on_ray(
                spec, options, meta, progress, say, store, batch_id, model
            )
    finally:
        await store.close()


async def _dispatch_on_ray(
    spec: BatchSpec,
    options: RunOptions,
    meta: Mapping[str, Any] | None,
    progress: BatchProgress,
    say: Callable[[str], None],
    store: Store,
    batch_id: str,
    model: str,
) -> BatchResult:
    """The batch on the cluster, once this process holds its lease."""
    from .cluster.dispatch import RayDispatch  # the optional rolltap[ray]
    from .cluster.service import RayHost, cluster_executors

    harness, backends = adapter(spec.harness), options.backends
    todo, kept = await plan(
        store,
        batch_id,
        list(spec.tasks),
        spec.samples_per_task,
        harness=harness.name,
        model=model,
        budgets=spec.budgets,
        meta=_rollout_meta(spec, meta, options.token_in),
        retry_failed=options.retry_failed,
    )
    if kept:
        say(f"batch {batch_id}: {len(kept)} rollouts already finished, {len(todo)} to run")
    cluster = RayHost(
        store,
        options.ray or "auto",
        backends,
        lambda: model,
        sandbox_image=options.sandbox_image,
        logs_root=options.logs_root,
        token_in=options.token_in,
        task_hashes=await asyncio.to_thread(lambda: {t.id: task_hash(t) for t in spec.tasks}),
        prebuild=tuple({p.task.id: p.task for p in todo}.values()),
    )
    started = time.monotonic()
    async with cluster_executors(cluster)(spec, batch_id) as executor:
        assert isinstance(executor, RayDispatch)
        caps = ", ".join(str(cap) for cap in executor.nodes.values())
        say(f"Ray: {len(executor.nodes)} sandbox nodes (caps {caps}); {len(todo)} rollouts")
        progress.total = len(todo)
        results = [
            _counted(progress, await done)
            for done in asyncio.as_completed([executor.run(p) for p in todo])
        ]
    views = current_attempts(await store.rollouts(batch=batch_id))
    summary = summarize(batch_id, views, time.monotonic() - started)
    return BatchResult(batch_id, results, summary)


def _rollout_meta(
    spec: BatchSpec, meta: Mapping[str, Any] | None, token_in: TokenInOptions | None
) -> dict[str, Any]:
    """Each new rollout's meta: the caller's, what the spec asks the proxy to impose, the
    sandbox kind and token-in."""
    imposed: dict[str, Any] = {}
    if spec.sampling:
        imposed["sampling"] = dict(spec.sampling)
    if spec.capture_routed_experts:
        imposed["routed_experts"] = True
    return {**(meta or {}), **imposed, "sandbox": spec.sandbox, **token_in_meta(token_in)}


def _egress(spec: BatchSpec, options: RunOptions) -> EgressSettings | None:
    """The run's egress config in the mode the spec asks for, its hosts added; None: no egress
    (the executor derives the same for its gate)."""
    if spec.egress is EgressMode.NONE:
        return None
    config = options.egress or EgressSettings()
    return replace(config, mode=spec.egress, allow=(*config.allow, *spec.egress_allow))


def _outcome(
    spec: BatchSpec,
    options: RunOptions,
    egress: EgressSettings | None,
    harness: str,
    model: str,
) -> BatchSettings:
    """The settings that change a batch's outcome: a rerun must repeat them to resume it."""
    return BatchSettings.of(
        harness=harness,
        model=model,
        backends=options.backends,
        engine_model=options.engine_model,
        engine_args=options.engine_args,
        sandbox=spec.sandbox,
        sandbox_image=options.sandbox_image,
        max_calls=spec.budgets.max_calls,
        max_tokens=spec.budgets.max_tokens,
        max_tokens_cap=options.max_tokens_cap,
        max_steps=spec.budgets.max_steps,
        timeout=spec.budgets.timeout,
        keep_git_history=None if options.prune_git_history else True,
        egress=None
        if egress is None or not egress.enabled
        else f"{egress.mode.value} {' '.join(sorted(egress.allow))}".strip(),
    )


def _detectors(given: Sequence[str | Detector] | None) -> list[Detector]:
    """The defaults plus the named ones (DetectorError, before anything runs, for a bad name)."""
    names = [d for d in given or () if isinstance(d, str)]
    return [*load_detectors(names), *(d for d in given or () if not isinstance(d, str))]


def _counted(progress: BatchProgress, result: RolloutResult) -> RolloutResult:
    progress.done += 1
    if result.status is not RolloutStatus.SUCCEEDED:
        progress.failed += 1
    if result.reward is not None:
        progress.rewards.append(result.reward)
    return result


async def _interrupted(store: Store, rollout_ids: Sequence[str]) -> None:
    """The batch was stopped (Ctrl-C, or its lease was taken over) and its rollouts have
    stopped: none of this run's stays `running` (its next run starts each again as a new
    attempt). Only this run's: another holder's attempts of the batch are its own."""
    for rollout_id in rollout_ids:
        view = await store.rollout(rollout_id)
        if view.status not in (RolloutStatus.PENDING, RolloutStatus.RUNNING):
            continue
        await store.report(view.id, Cancelled("interrupted"))
        if view.n_calls:
            await analyze_rollout(store, view.id)
        store.forget(view.id)
