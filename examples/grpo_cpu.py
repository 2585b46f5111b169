"""A real GRPO loop on CPU: SmolLM2-135M samples through rolltap's rollout service, a copy of it
learns from the groups, and every next batch runs on the weights it just learned.

    python examples/grpo_cpu.py --iterations 2 --out /tmp/grpo      # report: /tmp/grpo/report.json

It starts `rolltap serve --runner` (the built-in engine, the proxy and the rollout service in
one process), then, each iteration:

1. submits a batch of short-answer tasks (examples/grpo_tasks.jsonl: the single-call harness asks
   once, a verifier greps answer.txt for the right word) and takes its groups as they complete;
2. recomputes, with the trainer's copy of the model, the logprob of every token the engine
   sampled and reports the gap (the training-inference mismatch) against the engine's recorded
   logprobs;
3. takes one importance-weighted policy-gradient step: GRPO advantages (each sample's reward
   against its group's mean and spread) times the PPO-clipped ratio of the trainer's probability
   to the engine's recorded one, token by token over what the model sampled;
4. saves the weights (safetensors) and pushes them to the engine with the service's weight
   update (`client.weight_update(version, model_path=...)`: calls wait, none fails), so the next
   batch is sampled, and stamped, with the new version.

Why the mismatch should be tiny, and the tolerance: the engine and the trainer hold the same
weights in float32 on the CPU. The engine samples at temperature 1 with no top-p, top-k or
penalties, so its logprobs (processed, the default `--logprobs-mode`) are the plain log-softmax
the trainer computes. What differs is only how the sums are ordered: the engine prefills in
chunks and decodes one token at a time from its K/V cache, batched with other rows; the trainer
runs one forward pass over the whole sequence. Float32 rounding of that order gives differences
around 1e-5 (the engine's prefix-cache tests measure 8e-6). TOLERANCE is 1e-3, a hundred times
that, and still well below what a real fault shows (logprobs of the wrong token, of another
weight version, or at another temperature differ by 1e-2 and more).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rolltap.client import Client, Group

TASKS = Path(__file__).with_name("grpo_tasks.jsonl")
TOLERANCE = 1e-3
"""The largest |trainer logprob - engine logprob| accepted for the same weights (see above)."""
MICRO_BATCH = 8
"""Sequences per forward/backward pass of the trainer."""
PROBE = "The capital of France is"
"""A fixed prompt whose greedy answer's logprobs show the engine's weights changed."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=4, help="tasks per batch (from the file)")
    parser.add_argument("--samples", type=int, default=4, help="samples per task (group size)")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--clip", type=float, default=0.2, help="PPO clip range")
    parser.add_argument("--sandbox", default="bwrap")
    parser.add_argument("--out", type=Path, help="work directory (default: a temporary one)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="rolltap-grpo-"))
    out.mkdir(parents=True, exist_ok=True)
    report = run(args, out)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    for it in report["iterations"]:
        gap = it["mismatch"]
        print(
            f"step {it['step']}: version {it['policy_version']}, {it['groups']} groups, "
            f"mean reward {it['mean_reward']:.2f}, mismatch max {gap['max_abs']:.2e} "
            f"mean {gap['mean_abs']:.2e} over {gap['tokens']} tokens, loss {it['loss']:+.4f}, "
            f"now version {it['update']['weight_version']}"
        )
    print(f"report: {out / 'report.json'}")


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    token = secrets.token_hex(16)
    tasks = [json.loads(line) for line in TASKS.read_text().splitlines() if line.strip()]
    tasks = tasks[: args.tasks]
    with serve(out, token, args.sandbox) as proxy, Client(proxy, token=token) as client:
        engine = _engine_url(proxy, token)
        policy = load_policy()
        optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=0.0)
        report: dict[str, Any] = {
            "proxy": proxy,
            "engine": engine,
            "db": str(out / "rolltap.sqlite"),
            "tolerance": TOLERANCE,
            "iterations": [],
            "probe": [probe(engine)],
        }
        version = "0"
        for step in range(1, args.iterations + 1):
            started = time.monotonic()
            batch = client.submit(
                tasks,
                harness="single-call",
                sandbox=args.sandbox,
                samples_per_task=args.samples,
                policy_version=version,
                labels={"step": step},
                sampling={"temperature": 1.0, "max_tokens": args.max_tokens},
                batch_id=f"grpo-{token[:8]}-{step}",
            )
            groups = list(client.groups(batch.id))
            sampled = time.monotonic()
            loss, gap, grad_norm = grpo_step(policy, optimizer, groups, args.clip)
            trained = time.monotonic()
            checkpoint = out / f"step-{step}"
            save_weights(policy, checkpoint)
            new_version = str(step)
            with client.weight_update(new_version, model_path=checkpoint) as update:
                pass
            rewards = [r or 0.0 for g in groups for r in g.rewards]
            report["iterations"].append(
                {
                    "step": step,
                    "batch_id": batch.id,
                    "policy_version": version,
                    "groups": len(groups),
                    "informative": sum(g.informative for g in groups),
                    "mean_reward": float(np.mean(rewards)) if rewards else 0.0,
                    "call_versions": sorted(
                        {str(v) for g in groups for t in g.trajectories for v in t.weight_versions}
                    ),
                    "mismatch": gap,
                    "loss": loss,
                    "grad_norm": grad_norm,
                    "update": {
                        "weight_version": (update.committed or {}).get("weight_version"),
                        "held_seconds": (update.committed or {}).get("held_seconds"),
                    },
                    "seconds": {
                        "sample": sampled - started,
                        "train": trained - sampled,
                        "save_and_update": time.monotonic() - trained,
                    },
                }
            )
            client.post_metrics(batch.id, _posted(report["iterations"][-1]), policy_version=version)
            report["probe"].append(probe(engine))
            version = new_version
        report["engine_weight_version"] = _get(f"{engine}/get_weight_version")["weight_version"]
        return report


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


def sampled_logprobs(policy: Any, pairs: list[tuple[Any, Any]]) -> list[torch.Tensor]:
    """For each (prompt ids, response ids): the policy's logprob of every response token given
    everything before it, from one right-padded forward pass over all of them."""
    lengths = [len(p) + len(r) for p, r in pairs]
    ids = torch.zeros((len(pairs), max(lengths)), dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, ((prompt, response), n) in enumerate(zip(pairs, lengths, strict=True)):
        ids[row, :n] = torch.from_numpy(np.concatenate([prompt, response]).astype(np.int64))
        attention[row, :n] = 1
    logits = policy(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
    chosen = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    return [
        chosen[row, len(prompt) - 1 : len(prompt) - 1 + len(response)]
        for row, (prompt, response) in enumerate(pairs)
    ]


def grpo_step(
    policy: Any, optimizer: torch.optim.Optimizer, groups: list[Group], clip: float
) -> tuple[float, dict[str, Any], float]:
    """One importance-weighted policy-gradient step on every sampled token of the groups.
    Returns (loss, the trainer/engine logprob gap, gradient norm)."""
    samples = []
    for group in groups:
        rewards = np.array([0.0 if r is None else r for r in group.rewards])
        spread = rewards.std()
        advantages = (rewards - rewards.mean()) / (spread + 1e-6) if spread > 0 else rewards * 0
        for sample, advantage in zip(group.samples, advantages, strict=True):
            for t in sample.trajectories:
                if t.loss_mask.any() and t.has_logprobs:
                    samples.append((t, float(advantage)))
    if not samples:
        return 0.0, {"tokens": 0, "max_abs": 0.0, "mean_abs": 0.0, "within": True}, 0.0
    optimizer.zero_grad()
    tokens = sum(int(t.loss_mask.sum()) for t, _ in samples)
    gaps: list[np.ndarray[Any, Any]] = []
    total = 0.0
    for start in range(0, len(samples), MICRO_BATCH):
        part = samples[start : start + MICRO_BATCH]
        news = sampled_logprobs(policy, [(t.prompt_ids, t.response_ids) for t, _ in part])
        terms = []
        for (t, advantage), new_all in zip(part, news, strict=True):
            mask = torch.from_numpy(t.loss_mask.astype(bool))
            new = new_all[mask]
            # The engine sampled these tokens: its logprobs are the behaviour policy's.
            old = torch.from_numpy(t.logprobs.astype(np.float32))[mask]
            gaps.append((new.detach() - old).abs().numpy())
            ratio = torch.exp(new - old)
            clipped = torch.clamp(ratio, 1 - clip, 1 + clip)
            terms.append(-torch.minimum(ratio * advantage, clipped * advantage).sum())
        loss = torch.stack(terms).sum() / tokens
        loss.backward()  # type: ignore[no-untyped-call]
        total += float(loss.detach())
    grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0))
    optimizer.step()
    gap = np.concatenate(gaps)
    mismatch = {
        "tokens": int(gap.size),
        "max_abs": float(gap.max()),
        "mean_abs": float(gap.mean()),
        "within": bool(gap.max() <= TOLERANCE),
    }
    return total, mismatch, grad_norm


def save_weights(policy: Any, directory: Path) -> None:
    from safetensors.torch import save_model

    directory.mkdir(parents=True, exist_ok=True)
    # save_model writes a tied tensor once (lm_head shares the embeddings), as save_pretrained.
    save_model(policy, str(directory / "model.safetensors"))


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


@contextlib.contextmanager
def serve(out: Path, token: str, sandbox: str) -> Iterator[str]:
    """`rolltap serve --runner` on a free port, its store in `out`; yields the proxy URL."""
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
        yield url
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


def _posted(iteration: dict[str, Any]) -> dict[str, Any]:
    """What the training view shows for the batch (rolltap ui; rolltap.runner.service.posted)."""
    return {
        "loss": iteration["loss"],
        "grad_norm": iteration["grad_norm"],
        "logprob_mismatch_max": iteration["mismatch"]["max_abs"],
        "logprob_mismatch_mean": iteration["mismatch"]["mean_abs"],
        "seconds": iteration["seconds"],
    }


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
