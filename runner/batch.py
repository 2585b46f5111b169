"""Run a batch: tasks x samples with one harness in one sandbox kind, through the proxy.

    result = await rolltap.runner.run_batch("examples/tasks", harness="mini-swe-agent",
                                            sandbox="bwrap", samples=4, concurrency=8)

Rerunning the same batch (same name, or the same tasks, harness, model and sandbox) resumes
it: finished rollouts are kept, unfinished ones get a new attempt; a rerun with other settings
that change the outcome is refused (runner/settings.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from ..analysis.hacks import Detector, load_detectors
from ..proxy.replay import Cassette
from ..proxy.tokenin.options import TokenInOptions
from ..store import RolloutStatus, Store
from ..store.lifecycle import OPEN
from ..store.url import DatabaseURL
from .egress import BadEgressSetting, EgressGate, EgressSettings, egress_gate
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
from .harnesses.images import build_context, host_ca_bundle
from .host import ProxyHost, proxy_host, token_in_meta
from .plan import Budget, plan
from .provenance import harness_metadata, task_hash
from .rollout import BatchProgress, BuildsHarnessImages, Pools, RolloutResult, Shared, run_rollout
from .sandboxes.base import SandboxProvider
from .sandboxes.kinds import make_provider
from .settings import BatchSettings
from .summary import BatchSummary, current_attempts, summarize
from .tasks import Task, load_tasks


@dataclass(frozen=True)
class BatchResult:
    batch_id: str
    results: list[RolloutResult]
    """The rollouts run this time (resumed batches also keep earlier ones: see summary)."""
    summary: BatchSummary


def default_batch_id(
    tasks: str | Path, harness: str, model: str, sandbox: str, samples: int
) -> str:
    """The same command names the same batch, so running it again resumes it."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(str(tasks)).stem)[:40] or "tasks"
    source = f"{Path(str(tasks)).resolve()}|{harness}|{model}|{sandbox}|{samples}"
    return f"{stem}-{harness}-{hashlib.sha256(source.encode()).hexdigest()[:8]}"


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
    """Run (or resume) a batch and return its results and summary.

    `meta` goes into each new rollout's meta; `replay` answers the batch's calls from a
    recorded rollout (runner/replay.py); `egress`: HTTP(S) out of the sandboxes through the
    run's egress gate (runner/egress), recorded with each rollout; `token_in`: the batch's
    rollouts in token-in mode when enabled, and the parsers of the run's own proxy;
    `prune_git_history=False` keeps each task's git history beyond its base commit (runner/
    guard.py); `detectors`: the reward-hack detectors by name or dotted path (analysis/hacks.py),
    or detectors themselves, added to the defaults (`load_detectors`)."""
    loaded = list(tasks) if not isinstance(tasks, str | Path) else load_tasks(Path(tasks))
    checkers = _detectors(detectors)
    if not loaded:
        raise ValueError("no tasks to run")
    adapter_ = adapter(harness) if isinstance(harness, str) else harness
    if harness_from not in ("auto", "host", "image"):
        raise ValueError(f"harness_from={harness_from!r}: use auto, host or image")
    kind = sandbox if isinstance(sandbox, str) else sandbox.kind
    if egress is not None and egress.enabled and kind == "local":
        raise BadEgressSetting("--egress needs an isolated sandbox (bwrap, docker, apptainer)")
    builtin = isinstance(adapter_.packages, BuiltIn)
    # Docker runs the harness from harness_images/<name>/ built on the task's image.
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
    progress = progress or BatchProgress()
    async with contextlib.AsyncExitStack() as stack:
        if store is None:
            store = await Store.connect(db)
            stack.push_async_callback(store.close)
        host: ProxyHost = await stack.enter_async_context(
            proxy_host(
                store,
                backends=backends,
                model=model,
                socket=proxy_socket,
                engine_model=engine_model,
                engine_args=engine_args,
                max_tokens_cap=max_tokens_cap,
                needs_model=not builtin and (replay is None or replay.goes_live),
                replay=replay,
                token_in=token_in,
                say=say,
            )
        )
        gate: EgressGate | None = None
        if egress is not None and egress.enabled:
            gate = await stack.enter_async_context(
                egress_gate(
                    egress, directory=host.socket.parent, proxy_socket=host.socket, store=store
                )
            )
            say(f"egress: {egress.mode.value}, allow-list {', '.join(egress.allow) or '(empty)'}")
        source = tasks if isinstance(tasks, str | Path) else ",".join(t.id for t in loaded)
        batch_id = batch or default_batch_id(source, adapter_.name, host.model, kind, samples)
        outcome = BatchSettings.of(
            harness=adapter_.name,
            model=host.model,
            backends=backends,
            engine_model=engine_model,
            engine_args=engine_args,
            sandbox=kind,
            sandbox_image=sandbox_image,
            max_calls=max_calls,
            max_tokens=max_tokens,
            max_tokens_cap=max_tokens_cap,
            max_steps=max_steps,
            timeout=timeout,
            keep_git_history=None if prune_git_history else True,
            egress=None
            if egress is None or not egress.enabled
            else f"{egress.mode.value} {' '.join(sorted(egress.allow))}".strip(),
        )
        todo, kept = await plan(
            store,
            batch_id,
            loaded,
            samples,
            harness=adapter_.name,
            model=host.model,
            budget=Budget(max_calls, max_tokens),
            meta={**(meta or {}), "sandbox": kind, **token_in_meta(token_in)},
            settings=outcome,
        )
        if kept or any(p.attempt > 0 for p in todo):
            say(
                f"resuming batch {batch_id}: {len(kept)} of {len(kept) + len(todo)} rollouts "
                f"already finished, {len(todo)} to run"
            )
        if isinstance(sandbox, str):
            provider = await make_provider(sandbox, image=sandbox_image)
            stack.push_async_callback(provider.close)
        else:
            provider = sandbox
        image_context = None
        if images:
            if not isinstance(provider, BuildsHarnessImages):
                raise ValueError(f"the {kind} sandbox cannot build harness images; use host")
            context = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rolltap-img-")))
            image_context = build_context(adapter_, context, host_ca_bundle())
        # A crashed earlier run of this batch may have left sandboxes behind.
        await provider.sweep(batch_id)
        task_hashes = await asyncio.to_thread(lambda: {t.id: task_hash(t) for t in loaded})
        installed_from = "builtin" if builtin else "image" if images else "host"
        settings: dict[str, Any] = {"model": host.model, "max_steps": max_steps, "timeout": timeout}
        if gate is not None:
            allowed = list(gate.settings.allow)
            settings["egress"] = {"mode": gate.settings.mode.value, "allow": allowed}
        progress.total = len(todo)
        progress.token_count = host.tokens_recorded
        progress.call_count = host.calls_recorded
        shared = Shared(
            store=store,
            provider=provider,
            harness=adapter_,
            installation=installed,
            pools=Pools.sized(
                init_concurrency or concurrency, concurrency, eval_concurrency or concurrency
            ),
            run_id=batch_id,
            proxy_socket=host.socket,
            model=host.model,
            logs_root=logs_root or platformdirs.user_data_path("rolltap") / "runs" / batch_id,
            timeout=timeout,
            max_steps=max_steps,
            retries=retries,
            progress=progress,
            sandbox_kind=kind,
            image=sandbox_image,
            image_context=image_context,
            run_meta=harness_metadata(adapter_, installed_from, settings),
            task_hashes=task_hashes,
            revoke_key=host.revoke,
            egress=gate,
            prune_git=prune_git_history,
            detectors=checkers,
        )
        started = time.monotonic()
        try:
            results = await asyncio.gather(*(run_rollout(shared, p) for p in todo))
        except asyncio.CancelledError:
            await _interrupted(store, batch_id)
            raise
        views = current_attempts(await store.rollouts(batch=batch_id))
        summary = summarize(batch_id, views, time.monotonic() - started)
        return BatchResult(batch_id, list(results), summary)


def _detectors(given: Sequence[str | Detector] | None) -> list[Detector]:
    """The defaults plus the named ones (DetectorError, before anything runs, for a bad name)."""
    names = [d for d in given or () if isinstance(d, str)]
    return [*load_detectors(names), *(d for d in given or () if not isinstance(d, str))]


async def _interrupted(store: Store, batch_id: str) -> None:
    """The batch was stopped (Ctrl-C) and its rollouts have stopped: none stays `running`
    (its next run starts each again as a new attempt)."""
    unfinished = [RolloutStatus.PENDING.value, RolloutStatus.RUNNING.value]
    for view in await store.rollouts(batch=batch_id, status=unfinished):
        await store.update_rollout(
            view.id, status=RolloutStatus.CANCELLED, error="interrupted", only_from=OPEN
        )
        if view.n_calls:
            await store.analyze_rollout(view.id)
        store.forget(view.id)
