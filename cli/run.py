"""`rolltap run` (a batch of tasks with a harness in sandboxes) and `rolltap demo`."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..engine.command import adapter_option
from ..proxy.tokenin.options import TokenInOptions
from ..runner.harnesses import adapters, builtins
from ..runner.harnesses.oracle import NAME as ORACLE
from ..runner.harnesses.oracle import failed_oracle
from ..runner.sandboxes.kinds import KINDS
from .options import (
    builtin_adapter_args,
    capture_routed_experts_option,
    checked_backends,
    db_option,
    engine_arg_option,
    max_tokens_cap_option,
    refuse_routed_experts,
)
from .token_in import token_in_options

if TYPE_CHECKING:
    from rich.console import Console

    from ..runner import BatchProgress, BatchResult, BatchSummary
    from ..runner.tasks import Task

# The runner (its batch pipeline, the store, the proxy, the sandboxes) and rich are imported
# when a command runs: `rolltap run --help` needs only the names of harnesses and sandboxes.

DEMO_TASKS = ("hello-file", "answer-42", "make-dir")


@click.command()
@click.argument("tasks", type=click.Path(exists=True, path_type=Path))
@click.option(
    "-t",
    "--task",
    "task_ids",
    multiple=True,
    metavar="ID",
    help="Only this task of TASKS (repeatable).",
)
@click.option(
    "--harness",
    default="mini-swe-agent",
    show_default=True,
    type=click.Choice([*adapters(), *builtins()]),
    help="An agent harness, or `oracle`: each task's reference solution, to check the tasks.",
)
@click.option("--sandbox", default="bwrap", show_default=True, type=click.Choice(KINDS))
@click.option(
    "-n",
    "--samples",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Rollouts per task.",
)
@click.option(
    "-c",
    "--concurrency",
    default=4,
    show_default=True,
    type=click.IntRange(min=1),
    help="Harnesses at once.",
)
@click.option("--eval-concurrency", type=int, help="Verifiers at once (default: -c).")
@click.option(
    "--backend",
    "backends",
    multiple=True,
    metavar="[KIND=]URL",
    help="Inference backend(s); default: the built-in engine.",
)
@click.option("--model", help="Served model name (default: what the backend serves).")
@click.option("--batch", help="Batch name; the same name resumes the batch.")
@click.option(
    "--wait",
    is_flag=True,
    help="Another process runs this batch (same store): wait for it to end, then resume.",
)
@click.option(
    "--retry-failed",
    is_flag=True,
    help="Resume: rerun every rollout that did not finish (failed, timed out, over budget), "
    "not only those that failed with no verdict (sandbox, harness crash, lost attempt).",
)
@click.option(
    "--timeout",
    type=float,
    help="Harness wall-clock limit in seconds (default: the task's [agent] timeout_sec).",
)
@click.option(
    "--max-calls",
    default=100,
    show_default=True,
    help="LLM calls per rollout before the proxy ends it (0: no limit).",
)
@click.option(
    "--max-tokens",
    default=0,
    show_default=True,
    help="Prompt + completion tokens per rollout (0: no limit).",
)
@click.option("--max-steps", type=int, help="The harness's own step limit, where it has one.")
@click.option("--retries", default=2, show_default=True, help="Retries of infrastructure failures.")
@click.option(
    "--proxy-socket",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Use a running proxy's unix socket (same --db) instead of starting one; needs --model.",
)
@click.option("--engine-model", help="Built-in engine: a model dir or GGUF file.")
@engine_arg_option
@adapter_option("default")
@max_tokens_cap_option
@click.option("--sandbox-image", help="Sandbox root: docker base image, bwrap rootfs, SIF file.")
@click.option(
    "--harness-from",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "host", "image"]),
    help="image: harness_images/NAME/Dockerfile built on the task image (docker's "
    "default); host: the `rolltap harness install` prefix, mounted read-only.",
)
@click.option(
    "--egress",
    default="none",
    show_default=True,
    type=click.Choice(["none", "allowlist", "intercept"]),
    help="none: sandboxes reach only the proxy. allowlist: also HTTP(S) to allowed hosts "
    "(recorded; `rolltap egress install` first). intercept: allowlist, and LLM API hosts "
    "(api.openai.com, api.anthropic.com) captured into the rollout.",
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="PATTERN",
    help="A host tasks with allow_internet may reach with --egress (pypi.org, *.example.org).",
)
@click.option(
    "--egress-config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML: allow, intercept_hosts, upstream_ca, [resolve] (docs/egress.md).",
)
@click.option(
    "--ray",
    "ray_address",
    metavar="auto|ADDRESS",
    help="Run the rollouts on a Ray cluster (pip install 'rolltap[ray]'): each on a node that "
    "offers the `sandbox` resource, its sandbox and proxy there; the store must be PostgreSQL "
    "and --backend reachable from every node. auto: the cluster this machine belongs to.",
)
@click.option(
    "--sampling",
    "sampling_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="Impose a sampling option on every engine call of the batch (repeatable): "
    "temperature, top_p, top_k, min_p, max_tokens, seed, presence_penalty, frequency_penalty, "
    "repetition_penalty. A seed is derived per sample and call (docs/training.md).",
)
@click.option(
    "--keep-git-history",
    is_flag=True,
    help="Keep each task's git history beyond its base commit (other branches, tags, reflogs, "
    "stashes, unreachable objects). By default a workdir in a git repository keeps only what "
    "HEAD sees, unless the task says `prune_git_history = false`.",
)
@click.option(
    "--detector",
    "detectors",
    multiple=True,
    metavar="NAME|MODULE:ATTR",
    help="Check every finished rollout with a reward-hack detector of yours too (dotted path; "
    "repeatable), or leave a built-in out with -NAME (rolltap audit hacks).",
)
@token_in_options
@capture_routed_experts_option
@db_option
def run(
    tasks: Path,
    task_ids: tuple[str, ...],
    harness: str,
    sandbox: str,
    samples: int,
    concurrency: int,
    eval_concurrency: int | None,
    backends: tuple[str, ...],
    model: str | None,
    batch: str | None,
    wait: bool,
    retry_failed: bool,
    timeout: float | None,
    max_calls: int,
    max_tokens: int,
    max_steps: int | None,
    retries: int,
    proxy_socket: Path | None,
    engine_model: str | None,
    engine_args: tuple[str, ...],
    adapter: str,
    max_tokens_cap: int | None,
    sandbox_image: str | None,
    harness_from: str,
    egress: str,
    allow_hosts: tuple[str, ...],
    egress_config: Path | None,
    ray_address: str | None,
    sampling_pairs: tuple[str, ...],
    keep_git_history: bool,
    detectors: tuple[str, ...],
    token_in: TokenInOptions,
    capture_routed_experts: bool,
    db_url: str | None,
) -> None:
    """Run every task in TASKS (a task dir, a dir of them, or a .jsonl file) N times."""
    from ..analysis.choice import DetectorError, load_detectors
    from ..runner import BatchProgress, run_spec
    from ..runner.batch import RunOptions, tasks_of
    from ..runner.egress import load_settings
    from ..runner.service.spec import BatchSpec, Budgets, PoolSizes
    from .console import console_for_output
    from .progress import with_progress
    from .report import report

    try:
        load_detectors(list(detectors))
    except DetectorError as e:
        raise click.ClickException(str(e)) from e
    builtin = not backends and proxy_socket is None and ray_address is None
    engine_args = (
        *builtin_adapter_args(click.get_current_context(), adapter, engine_model, builtin),
        *engine_args,
    )

    sampling = _sampling(sampling_pairs)
    egress_settings = load_settings(egress, allow_hosts, egress_config)
    backends = tuple(checked_backends(backends))
    if capture_routed_experts:
        # Each rollout asks for them: this run's proxy, one behind --proxy-socket, or a Ray
        # node's. Without a backend (nor a proxy's socket) the built-in engine serves.
        refuse_routed_experts(list(backends), builtin=not backends and proxy_socket is None)
    if proxy_socket is not None and model is None:
        raise click.ClickException("--proxy-socket needs --model: the model name that proxy serves")
    if proxy_socket is not None and token_in != TokenInOptions(enabled=token_in.enabled):
        raise click.ClickException(
            "--proxy-socket: that proxy answers token-in calls with its own route and "
            "parsers (its `serve` flags); --token-in alone asks it to use token-in for this batch"
        )
    selected: Path | list[Task] = tasks
    if task_ids:
        selected = _select(tasks, task_ids)
    if ray_address is not None:
        _refuse_on_ray(click.get_current_context())
    options = RunOptions(
        db=db_url,
        backends=backends,
        model=model,
        proxy_socket=proxy_socket,
        engine_model=engine_model,
        engine_args=engine_args,
        max_tokens_cap=max_tokens_cap,
        sandbox_image=sandbox_image,
        harness_from=harness_from,
        egress=egress_settings,
        token_in=token_in,
        prune_git_history=not keep_git_history,
        detectors=detectors,
        ray=ray_address,
        wait=wait,
        retry_failed=retry_failed,
    )

    async def start(say: Callable[[str], None]) -> BatchResult:
        # The flags as the rollout service's batch spec (what POST /v1/batches takes).
        loaded, source = tasks_of(selected)
        spec = BatchSpec(
            tasks=loaded,
            tasks_source=source,
            harness=harness,
            sandbox=sandbox,
            samples_per_task=samples,
            budgets=Budgets(max_calls or None, max_tokens or None, timeout, max_steps),
            sampling=sampling,
            concurrency=concurrency,
            pools=PoolSizes(concurrency, concurrency, eval_concurrency or concurrency),
            retries=retries,
            egress=egress_settings.mode,
            capture_routed_experts=capture_routed_experts,
            id=batch,
        )
        return await run_spec(spec, options, progress=progress, say=say)

    console = console_for_output()
    progress = BatchProgress()
    if ray_address is None:
        result = with_progress(console, progress, start)
    else:
        result = _on_ray(console, progress, start)
    report(console, result, db_url)
    if harness == ORACLE:
        _oracle_verdict(console, result.summary)


_NOT_ON_RAY = {
    "concurrency": "-c/--concurrency",
    "eval_concurrency": "--eval-concurrency",
    "proxy_socket": "--proxy-socket",
    "engine_model": "--engine-model",
    "engine_args": "--engine-arg",
    "max_tokens_cap": "--max-tokens-cap",
    "harness_from": "--harness-from",
    "egress": "--egress",
    "allow_hosts": "--allow-host",
    "egress_config": "--egress-config",
    "keep_git_history": "--keep-git-history",
    "detectors": "--detector",
}
"""Flags of a local batch that a Ray batch cannot honour: each node runs its own proxy in front
of --backend, harnesses from the node's host install, as many at once as its `sandbox` cap."""


def _refuse_on_ray(ctx: click.Context) -> None:
    given = [
        flag
        for name, flag in _NOT_ON_RAY.items()
        if ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)
    ]
    if given:
        raise click.ClickException(
            f"{', '.join(given)}: not for a Ray batch (each node runs its own proxy in front of "
            "--backend, as many rollouts at once as its `sandbox` resource allows)"
        )


def _on_ray(
    console: Console,
    progress: BatchProgress,
    start: Callable[[Callable[[str], None]], Coroutine[Any, Any, BatchResult]],
) -> BatchResult:
    from .progress import with_progress

    try:
        from ..runner.cluster.dispatch import NoSandboxNodes
    except ImportError:
        raise click.ClickException("--ray needs Ray: pip install 'rolltap[ray]'") from None
    try:
        return with_progress(console, progress, start)
    except (ValueError, NoSandboxNodes, ConnectionError) as e:
        raise click.ClickException(str(e)) from None


def _sampling(pairs: tuple[str, ...]) -> dict[str, float | int]:
    """--sampling KEY=VALUE pairs, checked as the rollout service checks a batch's."""
    from ..runner.service.spec import SpecError, parse_sampling

    given: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r}: give KEY=VALUE", param_hint="--sampling")
        try:
            given[key.strip()] = float(value)
        except ValueError:
            why = f"{pair!r}: VALUE must be a number"
            raise click.BadParameter(why, param_hint="--sampling") from None
    try:
        return parse_sampling(given)
    except SpecError as e:
        raise click.BadParameter(str(e), param_hint="--sampling") from None


def _select(tasks: Path, ids: tuple[str, ...]) -> list[Task]:
    from ..runner.tasks import load_tasks

    loaded = {t.id: t for t in load_tasks(tasks)}
    missing = [i for i in ids if i not in loaded]
    if missing:
        raise click.ClickException(
            f"--task {', '.join(missing)}: not in {tasks} (it holds {', '.join(sorted(loaded))})"
        )
    return [loaded[i] for i in dict.fromkeys(ids)]


def _oracle_verdict(console: Console, summary: BatchSummary) -> None:
    """Exit 1 naming every task whose verifier did not fully reward its own solution."""
    failed = failed_oracle(summary)
    n = len(summary.tasks)
    if not failed:
        console.print(f"[green]every task passed its oracle ({n} task{'s' * (n != 1)})[/green]")
        return
    console.print(f"[red]{len(failed)} of {n} tasks failed their oracle:[/red]")
    for t in failed:
        mean = "-" if t.mean_reward is None else f"{t.mean_reward:.3f}"
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(t.statuses.items()))
        console.print(f"  {t.task_id}: mean reward {mean} ({statuses})")
    raise SystemExit(1)


@click.command()
@click.option("--sandbox", type=click.Choice(KINDS), help="Default: bwrap, else local.")
@click.option("-n", "--samples", default=1, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--temperature",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0.0, max=2.0),
    help="Imposed on every call. 0: the model's most likely action, the same on every run; "
    "1.0 samples as a training run does (the 135M model then solves less).",
)
@adapter_option("default")
@db_option
def demo(
    sandbox: str | None, samples: int, temperature: float, adapter: str, db_url: str | None
) -> None:
    """The embedded default end to end: built-in engine, proxy, mini-swe-agent on a few tasks."""
    from ..runner import BatchProgress, run_batch
    from ..runner.tasks import load_tasks
    from .console import console_for_output
    from .progress import with_progress
    from .report import report

    adapter_args = builtin_adapter_args(click.get_current_context(), adapter, None, True)
    console = console_for_output()
    if sandbox is None:
        sandbox = "bwrap" if shutil.which("bwrap") and _bwrap_works() else "local"
        if sandbox == "local":
            console.print(
                "[yellow]bubblewrap is not usable here: running in the local sandbox, "
                "which does not isolate the agent from this machine[/yellow]"
            )
    tasks = [t for t in load_tasks(example_tasks()) if t.id in DEMO_TASKS]
    progress = BatchProgress()
    result = with_progress(
        console,
        progress,
        lambda say: run_batch(
            tasks,
            harness="mini-swe-agent",
            sandbox=sandbox,
            samples=samples,
            concurrency=3,
            batch=f"demo-{sandbox}-{int(time.time())}",
            db=db_url,
            timeout=300,
            max_calls=20,
            max_steps=8,
            sampling={"temperature": temperature},
            engine_args=adapter_args,
            progress=progress,
            say=say,
        ),
    )
    report(console, result, db_url)


def example_tasks() -> Path:
    """examples/tasks as installed (package data of rolltap.examples)."""
    from .. import examples

    return Path(examples.__file__).parent / "tasks"


def _bwrap_works() -> bool:
    import subprocess

    probe = subprocess.run(
        ["bwrap", "--ro-bind", "/", "/", "--unshare-all", "true"], capture_output=True, check=False
    )
    return probe.returncode == 0
