"""Run a recorded rollout's task again, its model calls answered from its own record.

    replayed = await replay_rollout("01K...", store=store)
    replayed.report.reproduced   # every call matched and the same reward

The replay is an ordinary batch of one (runner/batch.py: sandbox, task setup, the harness, the
verifier, the store) with the same task, harness and settings as the original
(`rollout.meta["run"]`, runner/provenance.py), and a proxy whose cassette serves the original's
calls (rolltap.proxy.replay) instead of an engine. Its rollout is recorded like any other, in a
batch of its own (`replay-<original>-<suffix>`), linked to the original (`meta["replay_of"]`;
the original lists it in `meta["replays"]`), and carries the report (`meta["replay"]`,
rolltap.audit.replay).

Refused with one line (ReplayError): a rollout with no run record, a task that is gone, or one
whose content changed since (unless `allow_task_change`). A different harness version or
sandbox kind is allowed and noted in the report. Infrastructure failures are not retried: a
second attempt would meet a cassette the first one already played.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.hacks import AUDIT_META
from ..audit.replay import REPLAY_OF, REPLAYS, REPORT_KEY, Mode, ReplayReport
from ..proxy.answers import live_answer
from ..proxy.replay import VERSION, Cassette
from ..proxy.upstream.sampling import SEED_FROM
from ..store import NotFound, RolloutView, Store
from ..store.store import FINAL_STATUSES
from ..store.url import DatabaseURL
from .batch import run_batch
from .harnesses import adapter
from .provenance import harness_version, task_hash
from .rollout import RolloutResult
from .sandboxes.base import SandboxProvider
from .tasks import Task, load_tasks

_HARNESS_FROM = {"host": "host", "image": "image"}
"""meta.run.adapter.installed_from -> run_batch's harness_from (a built-in harness: auto)."""


def _pruned(meta: dict[str, Any]) -> bool:
    """Whether the original's git history beyond its base commit was pruned (runner/guard.py):
    a replay shows the agent the workspace it saw. A rollout from before the prune had it all."""
    audit = meta.get(AUDIT_META)
    git = audit.get("git") if isinstance(audit, dict) else None
    if isinstance(git, dict):
        return bool(git.get("pruned"))
    # Facts without a repository: nothing to prune. No facts: recorded before the prune existed.
    return isinstance(audit, dict)


def _sampling_of(original: RolloutView) -> dict[str, Any]:
    """The original's imposed sampling, its seeds derived from the original's identity: a call
    that goes live (continue-live) samples with the seed the original's call at its place had."""
    sampling = original.meta.get("sampling")
    if not isinstance(sampling, dict):
        return {}
    origin = {
        "task": original.task_id or "",
        "sample": original.sample_index or 0,
        "attempt": original.attempt,
    }
    return {"sampling": sampling, SEED_FROM: origin}


class ReplayError(Exception):
    """The rollout cannot be replayed as asked (one line for the user)."""


@dataclass(frozen=True)
class Replayed:
    report: ReplayReport
    result: RolloutResult

    @property
    def infrastructure_failed(self) -> bool:
        return (self.result.error or "").startswith("infrastructure:")


async def replay_rollout(
    rollout_id: str,
    *,
    store: Store | None = None,
    db: str | DatabaseURL | None = None,
    mode: Mode = Mode.REPLAY,
    sandbox: str | SandboxProvider | None = None,
    backends: Sequence[str] = (),
    engine_model: str | None = None,
    allow_task_change: bool = False,
    logs_root: Path | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> Replayed:
    """Replay a rollout; `backends`/`engine_model` serve `continue-live` (default: the built-in
    engine), and are refused otherwise."""
    if backends and mode is not Mode.CONTINUE_LIVE:
        raise ReplayError("--backend is for --continue-live: a replay answers from the record")
    async with contextlib.AsyncExitStack() as stack:
        if store is None:
            store = await Store.connect(db)
            stack.push_async_callback(store.close)
        try:
            original = await store.rollout(rollout_id)
        except NotFound:
            raise ReplayError(f"no rollout {rollout_id!r}") from None
        if original.status not in FINAL_STATUSES:
            raise ReplayError(f"rollout {original.id} is {original.status.value}: not finished")
        run = original.meta.get("run")
        if not isinstance(run, dict):
            raise ReplayError(
                f"rollout {original.id} has no run record (meta.run): it was not run by "
                "`rolltap run`, or by a rolltap that did not record one; it cannot be replayed"
            )
        notes: list[str] = []
        task = await asyncio.to_thread(_task, original, run, allow_task_change, notes)
        harness = adapter(str(run["harness"]))
        installed = harness_version(harness, list(harness.packages.requirements))
        if run.get("harness_version") and installed != run["harness_version"]:
            notes.append(f"{harness.name} {run['harness_version']} recorded, {installed} now")
        recorded = run.get("sandbox") or original.meta.get("sandbox") or "bwrap"
        kind = str(recorded) if sandbox is None else _kind(sandbox)
        if kind != recorded:
            notes.append(f"replayed in {kind}, recorded in {recorded}")
        settings: dict[str, Any] = run.get("adapter") or {}
        batch = f"replay-{original.id}-{secrets.token_hex(3)}"
        live = live_answer if mode is Mode.CONTINUE_LIVE else None
        cassette = await Cassette.load(store, original.id, mode=mode, batches=[batch], live=live)
        say(f"replaying rollout {original.id} ({harness.name}, task {task.id}) in {kind}")
        result = await run_batch(
            [task],
            harness=harness,
            sandbox=kind if sandbox is None else sandbox,
            harness_from=_HARNESS_FROM.get(str(settings.get("installed_from")), "auto"),
            concurrency=1,
            backends=backends,
            model=original.model,
            batch=batch,
            timeout=settings.get("timeout"),
            store=store,
            max_calls=original.max_calls,
            max_tokens=original.max_tokens,
            max_steps=settings.get("max_steps"),
            retries=0,
            engine_model=engine_model,
            sandbox_image=_sandbox_image(run, task, kind),
            logs_root=logs_root,
            meta={REPLAY_OF: original.id, **_sampling_of(original)},
            replay=cassette,
            prune_git_history=_pruned(original.meta),
            say=say,
        )
        (replayed,) = result.results
        report = ReplayReport(
            original=original.id,
            replay=replayed.rollout_id,
            mode=mode,
            calls=cassette.results(),
            recorded_reward=original.reward,
            replayed_reward=replayed.reward,
            recorded_status=original.status.value,
            replayed_status=replayed.status.value,
            normalization=VERSION,
            notes=notes,
            live_from=cassette.live_from,
        )
        await _store_report(store, original.id, report)
        return Replayed(report, replayed)


def _task(original: RolloutView, run: dict[str, Any], allow_change: bool, notes: list[str]) -> Task:
    path = Path(str(run.get("task_path") or ""))
    if not run.get("task_path") or not path.exists():
        raise ReplayError(f"task {original.task_id} is no longer at {path}")
    found = [t for t in load_tasks(path) if t.id == original.task_id]
    if not found:
        raise ReplayError(f"{path} has no task {original.task_id!r} any more")
    task = found[0]
    if task_hash(task) != run.get("task_hash"):
        if not allow_change:
            raise ReplayError(
                f"task {task.id} changed since rollout {original.id} ran (its content hash "
                "differs); --allow-task-change replays it anyway"
            )
        notes.append(f"task {task.id} changed since the rollout ran")
    return task


def _kind(sandbox: str | SandboxProvider) -> str:
    return sandbox if isinstance(sandbox, str) else sandbox.kind


def _sandbox_image(run: dict[str, Any], task: Task, kind: str) -> str | None:
    """The root the original ran from (a bwrap rootfs, a SIF file). Docker builds its images
    again from the task (whose content is checked) and the harness."""
    image = run.get("image")
    if kind == "docker" or not isinstance(image, str) or image == task.environment.docker_image:
        return None
    return image


async def _store_report(store: Store, original_id: str, report: ReplayReport) -> None:
    await store.update_rollout(report.replay, merge_meta={REPORT_KEY: report.to_json()})
    # Appended where the row is locked: two replays of one rollout finishing at once keep both.
    await store.update_rollout(original_id, append_meta={REPLAYS: [report.replay]})
