"""A real GRPO loop on CPU: SmolLM2-135M samples through rolltap's rollout service, a copy of it
learns from the groups, and every next batch runs on the weights it just learned.

    python examples/grpo_cpu.py --seed 0 --out /tmp/grpo    # /tmp/grpo/report.json, curve.png

It starts `rolltap serve --runner` (the built-in engine, the proxy and the rollout service in
one process), samples the held-out tasks once on the base weights (version 0), then, each
iteration:

1. submits a batch of tasks drawn from the training set (examples/grpo_train.jsonl, written by
   grpo_tasks.py: a word to say back and nothing else; the single-call harness asks once, the
   task's test checks answer.txt in the sandbox) and takes its groups as they complete;
2. recomputes, with the trainer's copy of the model, the logprob of every token the engine
   sampled and reports the gap (the training-inference mismatch) against the engine's recorded
   logprobs;
3. takes a PPO-clipped policy-gradient step: GRPO advantages (each sample's reward against its
   group's mean and spread) times the ratio of the trainer's probability to the engine's
   recorded one, token by token over what the model sampled (groups whose samples all scored
   the same carry no advantage and are only recomputed, for the mismatch);
4. saves the weights (safetensors, OUT/step-N, about 500 MB) and pushes them to the engine with
   the service's weight update (`client.weight_update(version, model_path=...)`: calls wait,
   none fails), so the next batch is sampled, and stamped, with the new version, then removes
   the previous step's checkpoint (`--keep-checkpoints` keeps every one); and posts its figures
   about the batch (`client.post_metrics`: rolltap ui's training view shows them).

At the end it samples the held-out tasks (examples/grpo_heldout.jsonl: words no training task
shows) again on the last weights, with the same seed, and draws the curve (matplotlib).

Why the mismatch should be tiny, and the tolerance: the engine and the trainer hold the same
weights in float32 on the CPU. The engine samples at temperature 1 with no top-p, top-k or
penalties, so its logprobs (processed, the default `--logprobs-mode`) are the plain log-softmax
the trainer computes. What differs is only how the sums are ordered: the engine prefills in
chunks and decodes one token at a time from its K/V cache, batched with other rows; the trainer
runs the prompt once and the group's answers over its K/V in one pass. Float32 rounding of that
order gives differences around 1e-5 (the engine's prefix-cache tests measure 8e-6). TOLERANCE is
1e-3, a hundred times that, and still well below what a real fault shows (logprobs of the wrong
token, of another weight version, or at another temperature differ by 1e-2 and more).

No KL term to a reference model: the run is short, the clip bounds each step's move from the
weights that sampled, and a reference copy would cost a third forward pass per group.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rolltap.client import Client, Group, Trajectory

HERE = Path(__file__).parent
TOLERANCE = 1e-3
"""The largest |trainer logprob - engine logprob| accepted for the same weights (see above)."""
PROBE = "The capital of France is"
"""A fixed prompt whose greedy answer's logprobs show the engine's weights changed."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=8, help="training tasks per batch")
    parser.add_argument("--samples", type=int, default=8, help="samples per task (group size)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-5, help="Adam learning rate")
    parser.add_argument("--epochs", type=int, default=1, help="gradient steps per batch")
    parser.add_argument("--clip", type=float, default=0.2, help="PPO clip range")
    parser.add_argument("--heldout", type=int, default=24, help="held-out tasks evaluated")
    parser.add_argument("--heldout-samples", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-tasks", type=Path, default=HERE / "grpo_train.jsonl")
    parser.add_argument("--heldout-tasks", type=Path, default=HERE / "grpo_heldout.jsonl")
    parser.add_argument("--sandbox", default="bwrap")
    parser.add_argument("--out", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep every step's weights in OUT/step-N (about 500 MB each); default: the last only",
    )
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="rolltap-grpo-"))
    out.mkdir(parents=True, exist_ok=True)
    report = run(args, out)
    report["curve"] = plot(report, out / "curve.png")
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(summary(report))
    print(f"report: {out / 'report.json'}")


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    token = secrets.token_hex(16)
    train, heldout = _read(args.train_tasks), _read(args.heldout_tasks)[: args.heldout]
    draws = _draws(train, args.tasks, random.Random(args.seed))
    began, clock = time.monotonic(), Clock()
    with serve(out, token, args.sandbox) as (proxy, server), Client(proxy, token=token) as client:
        clock.server = server
        engine = _engine_url(proxy, token)
        policy = load_policy()
        optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
        report: dict[str, Any] = {
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "proxy": proxy,
            "engine": engine,
            "db": str(out / "rolltap.sqlite"),
            "tolerance": TOLERANCE,
            "startup_seconds": time.monotonic() - began,
            "heldout": [],
            "iterations": [],
            "probe": [probe(engine)],
        }
        heldout_id = f"grpo-{token[:8]}-heldout-v"
        report["heldout"].append(evaluate(client, heldout, args, f"{heldout_id}0", "0", clock))
        version = "0"
        previous: Path | None = None  # the last step's checkpoint, removed after the next commit
        for step in range(1, args.iterations + 1):
            clock.start()
            tasks = next(draws)
            batch = client.submit(
                tasks,
                harness="single-call",
                sandbox=args.sandbox,
                samples_per_task=args.samples,
                policy_version=version,
                labels={"step": step, "set": "train"},
                sampling=_sampling(args, step),
                batch_id=f"grpo-{token[:8]}-{step}",
            )
            groups = list(client.groups(batch.id))
            clock.lap("sample")
            result = grpo_step(policy, optimizer, groups, args)
            clock.lap("train")
            checkpoint = out / f"step-{step}"
            save_weights(policy, checkpoint)
            if previous is None:
                print(_checkpoints_line(checkpoint, args.keep_checkpoints), flush=True)
            new_version = str(step)
            with client.weight_update(new_version, model_path=checkpoint) as update:
                pass
            # Only now: until the commit loaded the new weights, the engine could still be
            # reading the previous checkpoint (a failed update leaves it, and the run, as is).
            if previous is not None and not args.keep_checkpoints:
                shutil.rmtree(previous)
            previous = checkpoint
            clock.lap("update")
            rewards = [r or 0.0 for g in groups for r in g.rewards]
            iteration = {
                "step": step,
                "batch_id": batch.id,
                "policy_version": version,
                "tasks": [t["id"] for t in tasks],
                "groups": len(groups),
                "informative": sum(g.informative for g in groups),
                "mean_reward": float(np.mean(rewards)) if rewards else 0.0,
                "call_versions": sorted(
                    {str(v) for g in groups for t in g.trajectories for v in t.weight_versions}
                ),
                **result.report(),
                "update": {
                    "weight_version": (update.committed or {}).get("weight_version"),
                    "held_seconds": (update.committed or {}).get("held_seconds"),
                },
                **clock.report(),
            }
            report["iterations"].append(iteration)
            client.post_metrics(batch.id, _posted(iteration), policy_version=version)
            print(_line(iteration), flush=True)
            report["probe"].append(probe(engine))
            version = new_version
        report["heldout"].append(
            evaluate(client, heldout, args, f"{heldout_id}{version}", version, clock)
        )
        report["engine_weight_version"] = _get(f"{engine}/get_weight_version")["weight_version"]
        report["seconds"] = time.monotonic() - began
        report["cpu_seconds"] = clock.total()
    return report


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _draws(tasks: list[dict[str, Any]], n: int, rng: random.Random) -> Iterator[list[Any]]:
    """`n` different tasks at a time, each pass over the set in a new seeded order (the tasks
    left at the end of a pass, fewer than `n`, wait for the next)."""
    n = min(n, len(tasks))
    while True:
        order = rng.sample(tasks, len(tasks))
        for start in range(0, len(order) - n + 1, n):
            yield order[start : start + n]


def _sampling(args: argparse.Namespace, step: int) -> dict[str, Any]:
    """Temperature 1, nothing else: the engine's logprobs are then the policy's. The proxy
    derives each sample's own seed from this one (rolltap.proxy.upstream.sampling.derived_seed)."""
    return {"temperature": 1.0, "max_tokens": args.max_tokens, "seed": args.seed * 1000 + step}


def evaluate(
    client: Client,
    tasks: list[dict[str, Any]],
    args: argparse.Namespace,
    batch_id: str,
    version: str,
    clock: Clock,
) -> dict[str, Any]:
    """The mean reward on the held-out tasks of the weights in force, always with one seed."""
    clock.start()
    batch = client.submit(
        tasks,
        harness="single-call",
        sandbox=args.sandbox,
        samples_per_task=args.heldout_samples,
        policy_version=version,
        labels={"set": "heldout"},
        sampling=_sampling(args, 0),
        batch_id=batch_id,
    )
    groups = list(client.groups(batch.id))
    clock.lap("sample")
    rewards = [r or 0.0 for g in groups for r in g.rewards]
    result = {
        "policy_version": version,
        "batch_id": batch.id,
        "tasks": len(groups),
        "samples": len(rewards),
        "mean_reward": float(np.mean(rewards)) if rewards else 0.0,
        **clock.report(),
    }
    print(f"held-out on version {version}: mean reward {result['mean_reward']:.2f}")
    return result


@dataclass
class Clock:
    """Wall and CPU seconds per phase; CPU is this process's (the trainer) plus the server's
    (engine, proxy, service, sandboxes: the process tree of `rolltap serve`)."""

    server: int | None = None
    laps: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    _at: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def start(self) -> None:
        self.laps, self.cpu = {}, {}
        self._at = self._now()

    def lap(self, phase: str) -> None:
        now = self._now()
        self.laps[phase] = now[0] - self._at[0]
        self.cpu[phase] = (now[1] - self._at[1]) + (now[2] - self._at[2])
        self._at = now

    def report(self) -> dict[str, Any]:
        return {"seconds": dict(self.laps), "cpu_seconds": dict(self.cpu)}

    def total(self) -> dict[str, float]:
        _, trainer, server = self._now()
        return {"trainer": trainer, "server": server}

    def _now(self) -> tuple[float, float, float]:
        return time.monotonic(), time.process_time(), _tree_cpu(self.server)


def _tree_cpu(root: int | None) -> float:
    """User + system seconds of a process and its descendants: those alive (read from /proc,
    so Linux only; elsewhere 0) and those they waited for."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(entry.name)
        parents[pid], ticks[pid] = int(fields[1]), sum(int(f) for f in fields[11:15])
    tree = {root} if root in ticks else set()
    grown = True
    while grown:
        found = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= found
        grown = bool(found)
    return sum(ticks[pid] for pid in tree) / os.sysconf("SC_CLK_TCK")


def load_policy() -> Any:
    """The trainer's copy: the same dequantized SmolLM2 weights the engine serves, in float32."""
    from rolltap.engine.model import load_model, resolve_model

    # As the engine does: more OpenMP threads than free cores spin against each other (on two
    # cores, one thread runs a forward pass over ten times faster than two).
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    lm = load_model(resolve_model(None), device="cpu", dtype="float32")
    model = lm.model
    model.train()
    return model


def sampled_logprobs(policy: Any, prompt: Any, responses: list[Any]) -> list[torch.Tensor]:
    """The policy's logprob of every token of each response after `prompt`: the prompt runs
    once, then every response over its K/V in one right-padded pass (the logits only where a
    response token is predicted)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    prompt_ids = torch.tensor(np.asarray(prompt, dtype=np.int64))[None]
    head = policy.model(input_ids=prompt_ids, past_key_values=cache, use_cache=True)
    cache.batch_repeat_interleave(len(responses))
    width = max(len(r) for r in responses)
    ids = torch.zeros((len(responses), width), dtype=torch.long)
    attention = torch.zeros((len(responses), len(prompt) + width), dtype=torch.long)
    attention[:, : len(prompt)] = 1
    for row, response in enumerate(responses):
        ids[row, : len(response)] = torch.tensor(np.asarray(response, dtype=np.int64))
        attention[row, len(prompt) : len(prompt) + len(response)] = 1
    tail = policy.model(input_ids=ids, attention_mask=attention, past_key_values=cache)
    first = head.last_hidden_state[:, -1:].expand(len(responses), 1, -1)
    hidden = torch.cat([first, tail.last_hidden_state[:, :-1]], dim=1)
    logits = policy.lm_head(hidden).float()
    chosen = torch.log_softmax(logits, dim=-1).gather(-1, ids[..., None])[..., 0]
    return [chosen[row, : len(r)] for row, r in enumerate(responses)]


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    tokens: int
    learned_tokens: int
    gaps: list[np.ndarray[Any, Any]]

    def report(self) -> dict[str, Any]:
        gap = np.concatenate(self.gaps) if self.gaps else np.zeros(0)
        return {
            "loss": self.loss,
            "grad_norm": self.grad_norm,
            "learned_tokens": self.learned_tokens,
            "mismatch": {
                "tokens": int(gap.size),
                "max_abs": float(gap.max()) if gap.size else 0.0,
                "mean_abs": float(gap.mean()) if gap.size else 0.0,
                "within": bool(gap.size == 0 or gap.max() <= TOLERANCE),
            },
        }


def grpo_step(
    policy: Any, optimizer: torch.optim.Optimizer, groups: list[Group], args: argparse.Namespace
) -> StepResult:
    """`args.epochs` PPO-clipped policy-gradient steps on the groups' sampled tokens, the loss
    averaged over the tokens of the samples with an advantage. The mismatch is measured on the
    first pass, before any step."""
    prompts: dict[bytes, list[tuple[Trajectory, float]]] = {}
    for group in groups:
        rewards = np.array([0.0 if r is None else r for r in group.rewards])
        spread = rewards.std()
        advantages = (rewards - rewards.mean()) / (spread + 1e-6) if spread > 0 else rewards * 0
        for sample, advantage in zip(group.samples, advantages, strict=True):
            for t in sample.trajectories:
                if t.loss_mask.any() and t.has_logprobs:
                    prompts.setdefault(t.prompt_ids.tobytes(), []).append((t, float(advantage)))
    learned = sum(int(t.loss_mask.sum()) for ts in prompts.values() for t, a in ts if a != 0)
    result = StepResult(0.0, 0.0, 0, learned, [])
    for epoch in range(args.epochs):
        optimizer.zero_grad()
        for members in prompts.values():
            learn = any(a != 0 for _, a in members)
            if not learn and epoch > 0:
                continue
            with torch.set_grad_enabled(learn):
                news = sampled_logprobs(
                    policy, members[0][0].prompt_ids, [t.response_ids for t, _ in members]
                )
            terms = []
            for (t, advantage), new_all in zip(members, news, strict=True):
                mask = torch.from_numpy(t.loss_mask.astype(bool))
                new = new_all[mask]
                # The engine sampled these tokens: its logprobs are the behaviour policy's.
                old = torch.from_numpy(t.logprobs.astype(np.float32))[mask]
                if epoch == 0:
                    result.gaps.append((new.detach() - old).abs().numpy())
                    result.tokens += int(mask.sum())
                if advantage != 0:
                    ratio = torch.exp(new - old)
                    clipped = torch.clamp(ratio, 1 - args.clip, 1 + args.clip)
                    terms.append(-torch.minimum(ratio * advantage, clipped * advantage).sum())
            if terms:
                loss = torch.stack(terms).sum() / learned
                loss.backward()  # type: ignore[no-untyped-call]
                if epoch == 0:
                    result.loss += float(loss.detach())
        if learned:
            norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            result.grad_norm = max(result.grad_norm, float(norm))
            optimizer.step()
    return result


def save_weights(policy: Any, directory: Path) -> None:
    from safetensors.torch import save_model

    directory.mkdir(parents=True, exist_ok=True)
    # save_model writes a tied tensor once (lm_head shares the embeddings), as save_pretrained.
    save_model(policy, str(directory / "model.safetensors"))


def _checkpoints_line(checkpoint: Path, keep: bool) -> str:
    """Where the weights go, and how much disk that takes: 10 steps kept are over 5 GB."""
    size = sum(f.stat().st_size for f in checkpoint.iterdir()) / 1e6
    fate = (
        "every step's is kept (--keep-checkpoints)"
        if keep
        else "each replaces the one before (--keep-checkpoints keeps them all)"
    )
    return f"checkpoints: {checkpoint.parent}/step-N ({size:.0f} MB each); {fate}"


def probe(engine: str) -> dict[str, Any]:
    """The engine's greedy answer to PROBE, its logprobs and the version that sampled it."""
    body = {
        "prompt": PROBE,
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": 0,
        "return_token_ids": True,
        "return_weight_versions": True,
    }
    choice = _post(f"{engine}/v1/completions", body)["choices"][0]
    return {
        "weight_version": choice["weight_versions"][0]["version"],
        "token_ids": choice["token_ids"],
        "logprobs": choice["logprobs"]["token_logprobs"],
    }


def _posted(iteration: dict[str, Any]) -> dict[str, Any]:
    """What the training view shows for the batch: rolltap.runner.service.posted."""
    return {
        "loss": iteration["loss"],
        "grad_norm": iteration["grad_norm"],
        "logprob_mismatch_max": iteration["mismatch"]["max_abs"],
        "logprob_mismatch_mean": iteration["mismatch"]["mean_abs"],
        "seconds": iteration["seconds"],
        "cpu_seconds": iteration["cpu_seconds"],
    }


def _line(it: dict[str, Any]) -> str:
    gap, s = it["mismatch"], it["seconds"]
    return (
        f"step {it['step']}: version {it['policy_version']}, {it['informative']}/{it['groups']} "
        f"groups informative, mean reward {it['mean_reward']:.2f}, mismatch max "
        f"{gap['max_abs']:.1e} over {gap['tokens']} tokens, loss {it['loss']:+.4f}, seconds "
        f"sample {s['sample']:.0f} train {s['train']:.0f} update {s['update']:.0f}, "
        f"now version {it['update']['weight_version']}"
    )


def summary(report: dict[str, Any]) -> str:
    curve = " ".join(f"{it['mean_reward']:.2f}" for it in report["iterations"])
    first, last = report["heldout"][0], report["heldout"][-1]
    cpu = report["cpu_seconds"]
    return (
        f"mean reward per iteration: {curve}\n"
        f"held-out mean reward: {first['mean_reward']:.2f} on version "
        f"{first['policy_version']}, {last['mean_reward']:.2f} on version "
        f"{last['policy_version']}\n"
        f"{report['seconds']:.0f} s wall, CPU {cpu['trainer']:.0f} s trainer + "
        f"{cpu['server']:.0f} s server; curve: {report['curve']}"
    )


def plot(report: dict[str, Any], path: Path) -> str | None:
    """The mean reward per iteration and the held-out figures as a PNG; None without
    matplotlib (`pip install matplotlib`, or rolltap's `examples` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no curve drawn: pip install matplotlib", file=sys.stderr)
        return None
    its, held = report["iterations"], report["heldout"]
    figure, axes = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    for level in (0.3, 0.7):
        axes.axhline(level, color="grey", linewidth=0.8, linestyle=":")
    axes.plot(
        [int(it["policy_version"]) for it in its],
        [it["mean_reward"] for it in its],
        marker="o",
        markersize=3,
        label="training batch",
    )
    axes.plot(
        [int(h["policy_version"]) for h in held],
        [h["mean_reward"] for h in held],
        marker="s",
        linestyle="none",
        label="held-out tasks",
    )
    for h in held:
        axes.annotate(
            f"{h['mean_reward']:.2f}",
            (int(h["policy_version"]), h["mean_reward"]),
            textcoords="offset points",
            xytext=(6, -10 if h["mean_reward"] > 0.5 else 4),
            fontsize=8,
        )
    settings = report["settings"]
    axes.set(
        xlabel="policy version (weight updates)",
        ylabel="mean reward",
        ylim=(-0.02, 1.02),
        title=(
            f"GRPO, SmolLM2-135M on CPU: {settings['tasks']} tasks x {settings['samples']} "
            f"samples, lr {settings['lr']:g}, seed {settings['seed']}"
        ),
    )
    axes.title.set_fontsize(9)
    axes.grid(alpha=0.3)
    axes.legend(loc="center right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return str(path)


@contextlib.contextmanager
def serve(out: Path, token: str, sandbox: str) -> Iterator[tuple[str, int]]:
    """`rolltap serve --runner` on a free port, its store in `out`; yields the proxy URL and
    the server's process id."""
    port = _free_port()
    argv = [
        sys.executable,
        "-m",
        "rolltap.cli.main",
        "serve",
        "--runner",
        f"--runner-sandboxes={sandbox}",
        f"--port={port}",
        f"--db=sqlite:///{out / 'rolltap.sqlite'}",
        "--weight-version=0",
    ]
    env = {**os.environ, "ROLLTAP_ADMIN_TOKEN": token}
    with (out / "serve.log").open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process, out / "serve.log")
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"rolltap serve exited:\n{log.read_text()[-3000:]}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{url}/health", timeout=5) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.5)
    raise SystemExit(f"rolltap serve was not ready in time:\n{log.read_text()[-3000:]}")


def _engine_url(proxy: str, token: str) -> str:
    status = _get(f"{proxy}/admin/status", token)
    return str(status["backends"][0]["url"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, token: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as response:
        return json.load(response)


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request) as response:
        return json.load(response)


if __name__ == "__main__":
    main()
