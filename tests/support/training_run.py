"""A small training run through the real rollout service, for the training view's tests: three
steps of a trainer that submits a batch per policy version, reads its groups (kept and
dropped), posts its figures (`client.post_metrics`) and pushes a weight update, in front of the
fake engine in token-in mode. It returns a report shaped like examples/grpo_cpu.py's.

The tasks' harness makes two chat calls; the second continues the first's conversation, so
token-in bridges it, except where the task says `edit` (the harness rewrites the answer it got:
a break). The fake engine answers the second call of `alt` and `edit` tasks yes, no, yes...
(informative groups) and of `same` tasks always yes (dropped as uninformative). The third
batch is submitted for policy version 3 while the engine still holds version 2, as an
asynchronous trainer one step ahead does: its calls are one version stale.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

from rolltap.client import AsyncClient, Dropped, Group
from rolltap.proxy.tokenin.options import TokenInOptions
from rolltap.store import Store
from tests.support.fake_vllm import FakeVLLM, Reply, decode
from tests.support.proxy import fake_engine
from tests.support.service import running_service

TWO_CALLS = """
python3 - <<'PY'
import json, os, urllib.request

def ask(messages):
    body = {"model": os.environ["ROLLTAP_MODEL"], "messages": messages, "max_tokens": 8}
    request = urllib.request.Request(
        os.environ["ROLLTAP_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": "Bearer " + os.environ["ROLLTAP_KEY"]})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)["choices"][0]["message"]["content"]

instruction = os.environ["ROLLTAP_INSTRUCTION"]
history = [{"role": "user", "content": instruction}]
answer = ask(history)
if "edit" in instruction:
    answer += " (edited)"
history.append({"role": "assistant", "content": answer})
history.append({"role": "user", "content": "the tool said: 42"})
open("answer.txt", "w").write(ask(history))
PY
"""


def _task(kind: str) -> dict[str, Any]:
    return {"id": kind, "instruction": f"task:{kind} say yes", "test": "grep -q yes answer.txt"}


STEPS: list[tuple[str, list[str], str]] = [
    ("0", ["alt", "same", "edit"], "0"),
    ("1", ["alt", "same"], "1"),
    ("3", ["alt", "edit"], "2"),
]
"""(policy version, tasks, the engine's weight version while it samples) per step."""
SAMPLES = 2
POSTED = [
    {"max_abs": 2.5e-5, "mean_abs": 3.1e-6, "loss": -0.0125, "grad_norm": 0.75},
    {"max_abs": 4.0e-5, "mean_abs": 5.5e-6, "loss": 0.0031, "grad_norm": 0.5},
    {"max_abs": 1.2e-3, "mean_abs": 9.0e-5, "loss": 0.02, "grad_norm": 1.25},
]
"""What the fake trainer says it measured at each step."""


class _Answers:
    """The fake engine's script: second calls answered per task (see the module's docstring)."""

    def __init__(self) -> None:
        self._counts: dict[str, itertools.count[int]] = {}

    def reply(self, text: str) -> Reply:
        if "the tool said" not in text:
            return Reply(text="ok")
        found = re.search(r"task:(\w+)", text)
        kind = found.group(1) if found else "same"
        if kind == "same":
            return Reply(text="yes")
        n = next(self._counts.setdefault(kind, itertools.count()))
        return Reply(text="no" if n % 2 else "yes")

    def chat(self, body: dict[str, Any]) -> Reply:
        return self.reply(" ".join(str(m.get("content") or "") for m in body["messages"]))

    def completion(self, prompt: list[int]) -> Reply:
        return self.reply(decode(prompt))


def posted_metrics(iteration: dict[str, Any]) -> dict[str, Any]:
    """What a trainer posts about one iteration of the example's report."""
    return {
        "logprob_mismatch_max": iteration["mismatch"]["max_abs"],
        "logprob_mismatch_mean": iteration["mismatch"]["mean_abs"],
        "loss": iteration["loss"],
        "grad_norm": iteration["grad_norm"],
        "seconds": iteration["seconds"],
    }


async def make_training_run(store: Store, logs: Path) -> dict[str, Any]:
    """Runs the three steps into `store`; returns the report (with the service's session)."""
    answers = _Answers()
    fake = FakeVLLM(script=answers.chat, completion_script=answers.completion)
    report: dict[str, Any] = {"iterations": []}
    async with (
        fake_engine(fake) as engine,
        running_service(
            store,
            engine.url,
            logs=logs,
            scripts={"two-calls": TWO_CALLS},
            weight_version="0",
            token_in=TokenInOptions(enabled=True),
        ) as service,
    ):
        client = service.client
        for step, (version, kinds, _) in enumerate(STEPS, start=1):
            batch = await client.submit(
                [_task(kind) for kind in kinds],
                harness="two-calls",
                sandbox="bwrap",
                samples_per_task=SAMPLES,
                keep="informative",
                policy_version=version,
                labels={"run": "fake-grpo", "step": step},
                batch_id=f"fake-grpo-{step}",
            )
            iteration = await _iteration(client, batch.id, step, version)
            report["iterations"].append(iteration)
            await client.post_metrics(batch.id, posted_metrics(iteration))
            if step < len(STEPS):
                async with client.weight_update(STEPS[step][2]):
                    pass
        report["session"] = (await client.batch(batch.id)).data["session"]
    return report


async def _iteration(client: AsyncClient, batch_id: str, step: int, version: str) -> dict[str, Any]:
    kept: list[Group] = []
    dropped: list[Dropped] = []
    async for event in client.events(batch_id):
        if isinstance(event, Group):
            kept.append(event)
        elif isinstance(event, Dropped):
            dropped.append(event)
    rewards = [r for g in kept for r in g.rewards] + [r for d in dropped for r in d.rewards]
    figures = POSTED[step - 1]
    return {
        "step": step,
        "batch_id": batch_id,
        "policy_version": version,
        "groups": len(kept),
        "dropped": len(dropped),
        "rewards": rewards,
        "mean_reward": sum(r or 0.0 for r in rewards) / len(rewards),
        "call_versions": sorted(
            {str(v) for g in kept for t in g.trajectories for v in t.weight_versions}
        ),
        "mismatch": {"max_abs": figures["max_abs"], "mean_abs": figures["mean_abs"]},
        "loss": figures["loss"],
        "grad_norm": figures["grad_norm"],
        "seconds": {"sample": 1.5 * step, "train": 0.25 * step, "save_and_update": 0.5},
    }
