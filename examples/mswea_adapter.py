"""Teach SmolLM2-135M the action mini-swe-agent asks for, and ship it as a LoRA delta.

    python examples/mswea_adapter.py --seed 0   # works in /tmp/mswea-adapter, writes the adapter

mini-swe-agent 2.4 wants every answer to be one `bash` tool call; the built-in engine reads a
call from the model's text in the hermes format (engine/tools.py). The plain SmolLM2-135M
answers with prose or a malformed call, mini-swe-agent rejects it and asks again, and every
rejection breaks the rollout's token chain. Three steps, each runnable alone:

1. `tasks`: training tasks in the JSONL shorthand, drawn with the seed from eight families (write
   a word or a number to a file, make a directory, count a file's lines, make empty files, copy a
   file, reverse a file's lines, count the lines holding a word), in the phrasings people use,
   each with a one-line oracle solution. Names, words and numbers are drawn at random, mostly
   pseudo-words, so an answer is right only when it copies them from the instruction; no word or
   number of a held-out task's instruction (examples/tasks, kept for measuring) is ever drawn.
2. `record`: the real mini-swe-agent runs every training task through `rolltap run` (proxy,
   bubblewrap sandbox, the task's test), against an oracle backend that answers its first call
   with the task's solution as one bash tool call and its second with the submit command. What
   the proxy forwarded is kept: mini-swe-agent's own system prompt, instance template, tools and
   observation, as it sends them. Only tasks the verifier rewarded become examples.
3. `train`: LoRA on the attention and MLP projections of the top layers, supervised on the two
   answers (the solution call, then the submit call) of the first `--limit` recorded episodes,
   rendered with the built-in engine's own chat renderer, so the model learns exactly the text
   the engine parses and renders back. The lower layers stay frozen, so their output for each
   episode is computed once. In the first epoch each step runs the top layers over the prompt
   (about 1,000 tokens of mini-swe-agent's instructions) without gradient and over the answers
   with it; later epochs reuse each prompt's keys and values from the first (stale by at most
   an epoch), which halves their cost on a CPU.

The adapter file (safetensors) holds `<module>.lora_A` (rank x in) and `<module>.lora_B`
(out x rank) in float16, and `alpha`/`rank` in its metadata; the engine merges
W += alpha / rank * B @ A into the float32 weights at load time (engine/adapter.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import itertools
import json
import math
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_OUT = REPO / "engine" / "adapters" / "smollm2-135m-mswea.safetensors"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Names, words and numbers are drawn at random (pseudo-words from syllables, digits), so the only
# way to be right is to copy them from the instruction; a fixed list would be memorised (the first
# adapter wrote `mkdir -p backup` for "a directory named output"). A few real words keep names the
# tokenizer knows whole in the mix. Anything a held-out task's instruction says is never drawn.
_REAL = [
    "apple",
    "banana",
    "cherry",
    "river",
    "mountain",
    "yellow",
    "purple",
    "orange",
    "silver",
    "garden",
    "window",
    "rocket",
    "pencil",
    "coffee",
    "summer",
    "winter",
    "planet",
    "forest",
    "island",
    "bridge",
    "castle",
    "dragon",
    "guitar",
    "marble",
    "ocean",
    "pepper",
    "rabbit",
    "shadow",
    "thunder",
    "violet",
    "wizard",
    "zebra",
    "lemon",
    "tiger",
    "cloud",
    "stone",
    "notes",
    "result",
    "message",
    "reply",
    "status",
    "token",
    "label",
    "value",
    "final",
    "record",
    "entry",
    "letter",
    "memo",
    "flag",
    "info",
    "build",
    "logs",
    "results",
    "archive",
    "reports",
    "cache",
    "dist",
    "assets",
    "backup",
    "docs",
    "scratch",
    "outbox",
    "exports",
    "input",
    "report",
    "summary",
    "list",
    "table",
    "draft",
    "sample",
    "test",
    "demo",
    "alpha",
    "beta",
    "gamma",
    "delta",
    "north",
    "south",
    "east",
    "west",
    "green",
    "blue",
    "red",
    "black",
]
_ONSETS = [
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "j",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "w",
    "z",
    "br",
    "cl",
    "dr",
    "fl",
    "gr",
    "pl",
    "st",
    "tr",
    "sh",
    "ch",
]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "i", "o", "ai", "ou"]
_EXTS = (".txt", ".txt", ".txt", ".log", ".md", ".dat", ".csv", ".out")


class Names:
    """Draws fresh names, words and numbers with a seeded generator, none of them a word or a
    number any held-out task's instruction uses."""

    def __init__(self, rng: random.Random, banned: frozenset[str]) -> None:
        self.rng = rng
        self.banned = banned

    def word(self) -> str:
        while True:
            if self.rng.random() < 0.35:
                w = self.rng.choice(_REAL)
            else:
                parts = self.rng.randint(2, 3)
                w = "".join(
                    self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(parts)
                )
                if self.rng.random() < 0.3:
                    w += self.rng.choice("nrstlkm")
            if w not in self.banned:
                return w

    def stem(self) -> str:
        shape = self.rng.random()
        if shape < 0.6:
            return self.word()
        if shape < 0.8:
            return f"{self.word()}_{self.word()}"
        return f"{self.word()}{self.rng.randint(1, 99)}"

    def file(self, ext: str | None = None) -> str:
        while True:
            f = self.stem() + (ext or self.rng.choice(_EXTS))
            if f not in self.banned:
                return f

    def number(self) -> str:
        while True:
            n = str(self.rng.choice((self.rng.randint(0, 99), self.rng.randint(100, 99999))))
            if n not in self.banned:
                return n


def held_out_words(tasks_dir: Path = HERE / "tasks") -> frozenset[str]:
    """Every word, file name and number in the instructions of the held-out example tasks."""
    texts = [p.read_text() for p in sorted(tasks_dir.glob("*/instruction.md"))]
    for path in sorted(tasks_dir.glob("*.jsonl")):
        texts += [json.loads(line)["instruction"] for line in path.read_text().splitlines()]
    found: set[str] = set()
    for text in texts:
        for w in re.findall(r"[A-Za-z0-9_.\-]+", text):
            w = w.strip(".-")
            found |= {w, w.lower(), *w.split(".")}
    return frozenset(found - {""})


@dataclass(frozen=True)
class TrainTask:
    id: str
    instruction: str
    setup: str
    test: str
    solution: str

    def as_jsonl(self) -> str:
        obj = {
            "id": self.id,
            "instruction": self.instruction,
            "setup": self.setup,
            "test": self.test,
            "solution": self.solution,
            "agent_timeout_sec": 120,
        }
        return json.dumps(obj)


def make_tasks(count: int, seed: int) -> list[TrainTask]:
    """`count` training tasks, the families in turn, drawn with `seed`."""
    names = Names(random.Random(seed), held_out_words())
    families = [
        _write_word,
        _write_number,
        _make_dir,
        _count_lines,
        _touch,
        _copy,
        _reverse,
        _grep_count,
    ]
    tasks: list[TrainTask] = []
    seen: set[str] = set()
    for n in itertools.count():
        if len(tasks) == count:
            break
        task = families[n % len(families)](names, n)
        if task.instruction not in seen:
            seen.add(task.instruction)
            tasks.append(task)
    return tasks


def _same(path: str, value: str) -> str:
    return f"[ \"$(tr -d ' \\t\\r\\n' < {path})\" = {value} ]"


def _two_files(names: Names) -> tuple[str, str]:
    src, dst = names.file(), names.file()
    while dst == src:
        dst = names.file()
    return src, dst


def _write_word(names: Names, n: int) -> TrainTask:
    f, w = names.file(), names.word()
    instruction = names.rng.choice(
        (
            f"Create a file named {f} in the current directory containing the word {w}.",
            f"Write the word {w} into a file named {f} in the current directory.",
            f"Make a file called {f} whose content is the word {w}.",
        )
    )
    return TrainTask(f"word-{n}", instruction, "", _same(f, w), f"echo {w} > {f}")


def _write_number(names: Names, n: int) -> TrainTask:
    f, value = names.file(), names.number()
    instruction = names.rng.choice(
        (
            f"Write the number {value} into a file named {f} in the current directory.",
            f"Create a file named {f} in the current directory that holds the number {value}.",
            f"Put the number {value} in a file called {f}.",
        )
    )
    return TrainTask(f"number-{n}", instruction, "", _same(f, value), f"echo {value} > {f}")


def _make_dir(names: Names, n: int) -> TrainTask:
    d = names.stem()
    instruction = names.rng.choice(
        (
            f"Create a directory named {d} in the current directory.",
            f"Make a new folder called {d} in the current directory.",
            f"Create the directory {d}.",
        )
    )
    return TrainTask(f"dir-{n}", instruction, "", f"[ -d {d} ]", f"mkdir -p {d}")


def _count_lines(names: Names, n: int) -> TrainTask:
    src, dst = _two_files(names)
    lines = names.rng.randint(3, 90)
    setup = f"for i in $(seq {lines}); do echo line $i; done > {src}"
    instruction = names.rng.choice(
        (
            f"The file {src} in the current directory has some lines of text. Count them and "
            f"write the number (digits only) to a file named {dst}.",
            f"Count the lines of {src} and write the number to a file named {dst}.",
        )
    )
    solution = f"wc -l < {src} | tr -d ' ' > {dst}"
    return TrainTask(f"lines-{n}", instruction, setup, _same(dst, str(lines)), solution)


def _touch(names: Names, n: int) -> TrainTask:
    a, b = _two_files(names)
    if names.rng.random() < 0.5:
        instruction = names.rng.choice(
            (
                f"Create an empty file named {a} in the current directory.",
                f"Make an empty file called {a}.",
            )
        )
        return TrainTask(f"touch-{n}", instruction, "", f"[ -f {a} ] && [ ! -s {a} ]", f"touch {a}")
    instruction = f"Create the files {a} and {b} in the current directory."
    return TrainTask(f"touch-{n}", instruction, "", f"[ -f {a} ] && [ -f {b} ]", f"touch {a} {b}")


def _copy(names: Names, n: int) -> TrainTask:
    src, dst = _two_files(names)
    instruction = names.rng.choice(
        (
            f"Copy the file {src} to a new file named {dst} in the current directory.",
            f"Make a copy of {src} called {dst}.",
        )
    )
    setup = f"echo {names.word()} > {src}"
    return TrainTask(f"copy-{n}", instruction, setup, f"cmp -s {src} {dst}", f"cp {src} {dst}")


def _reverse(names: Names, n: int) -> TrainTask:
    src, dst = _two_files(names)
    words = [names.word() for _ in range(names.rng.randint(3, 6))]
    setup = "printf '" + "\\n".join(words) + "\\n' > " + src
    instruction = names.rng.choice(
        (
            f"Write the lines of {src} in reverse order (last line first) to {dst}.",
            f"Reverse the order of the lines of {src} and write them to a file named {dst}.",
        )
    )
    test = f'[ "$(cat {dst})" = "$(tac {src})" ]'
    return TrainTask(f"reverse-{n}", instruction, setup, test, f"tac {src} > {dst}")


def _grep_count(names: Names, n: int) -> TrainTask:
    src, dst = _two_files(names)
    w, other = names.word(), names.word()
    while other == w:
        other = names.word()
    hits, misses = names.rng.randint(1, 9), names.rng.randint(1, 9)
    lines = [f"{w} {k}" for k in range(hits)] + [f"{other} {k}" for k in range(misses)]
    names.rng.shuffle(lines)
    setup = "printf '" + "\\n".join(lines) + "\\n' > " + src
    instruction = (
        f"Count the lines of {src} in the current directory that contain the word {w}, and "
        f"write the number (digits only) to a file named {dst}."
    )
    solution = f"grep -c {w} {src} > {dst}"
    return TrainTask(f"grep-{n}", instruction, setup, _same(dst, str(hits)), solution)


# The oracle backend: an OpenAI-compatible server answering mini-swe-agent's calls.


class Oracle:
    """Answers a conversation with no tool result yet with the task's solution as one bash call,
    one with a result with the submit command; keeps every request the proxy forwarded."""

    def __init__(self, tasks: list[TrainTask]) -> None:
        self.solutions = {t.instruction: t.solution for t in tasks}
        self.requests: list[dict[str, Any]] = []

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        self.requests.append(body)
        results = sum(1 for m in messages if m.get("role") == "tool")
        if not body.get("tools"):
            return {"role": "assistant", "content": "ok"}
        command = self.solutions.get(_task_of(messages), "true") if results == 0 else SUBMIT
        call = {
            "id": f"call_{results}",  # not the request count: the same in every recording
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}


_TASK = re.compile(r"Please solve this issue: (.*?)\n\nYou can execute", re.DOTALL)


def _task_of(messages: list[dict[str, Any]]) -> str:
    for m in messages:
        if m.get("role") == "user":
            found = _TASK.search(str(m.get("content") or ""))
            if found:
                return found.group(1)
    return ""


async def _ok() -> Any:
    from aiohttp import web

    return web.Response()


async def _serve_oracle(oracle: Oracle, port_file: Path, stop: asyncio.Event) -> None:
    from aiohttp import web

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "oracle", "object": "model"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        message = oracle.answer(body)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        head = {"id": "chatcmpl-oracle", "created": 0, "model": body.get("model", "oracle")}
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": finish}
            return web.json_response(
                {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{**message["tool_calls"][0], "index": 0}]
        chunks = [
            {"index": 0, "delta": delta, "finish_reason": None},
            {"index": 0, "delta": {}, "finish_reason": finish},
        ]
        for choice in chunks:
            frame = {**head, "object": "chat.completion.chunk", "choices": [choice]}
            await response.write(f"data: {json.dumps(frame)}\n\n".encode())
        if (body.get("stream_options") or {}).get("include_usage"):
            frame = {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}
            await response.write(f"data: {json.dumps(frame)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application(client_max_size=64 * 1024**2)
    app.router.add_get("/health", lambda _: _ok())
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    port_file.write_text(str(port))
    await stop.wait()
    await runner.cleanup()


def record(tasks: list[TrainTask], work: Path, sandbox: str, concurrency: int) -> Path:
    """Run mini-swe-agent on every task against the oracle through `rolltap run`; write the
    rewarded episodes (the messages of each rollout's last call) to work/episodes.jsonl."""
    import threading

    work.mkdir(parents=True, exist_ok=True)
    task_file = work / "train_tasks.jsonl"
    task_file.write_text("".join(t.as_jsonl() + "\n" for t in tasks))
    oracle = Oracle(tasks)
    port_file = work / "oracle.port"
    port_file.unlink(missing_ok=True)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(
        target=loop.run_until_complete, args=(_serve_oracle(oracle, port_file, stop),)
    )
    thread.start()
    try:
        while not port_file.exists():
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port_file.read_text()}"
        db = work / "record.db"
        argv = [
            sys.executable,
            "-m",
            "rolltap.cli.main",
            "run",
            str(task_file),
            "--harness",
            "mini-swe-agent",
            "--sandbox",
            sandbox,
            "--backend",
            f"openai={url}",
            "--model",
            "oracle",
            "-c",
            str(concurrency),
            "--max-steps",
            "4",
            "--db",
            f"sqlite:///{db}",
            "--batch",
            "record",
        ]
        print("recording:", " ".join(argv[2:]), flush=True)
        subprocess.run(argv, check=True)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join()
    rewarded = asyncio.run(_rewarded_tasks(db))
    by_task = {t.instruction: t for t in tasks}
    episodes: dict[str, dict[str, Any]] = {}
    for body in oracle.requests:
        messages = body["messages"]
        if sum(1 for m in messages if m.get("role") == "tool") != 1:
            continue
        task = by_task.get(_task_of(messages))
        if task is None or task.id not in rewarded or task.id in episodes:
            continue
        messages = [*messages, _call_message(SUBMIT)]
        episodes[task.id] = {"task": task.id, "messages": messages, "tools": body["tools"]}
    out = work / "episodes.jsonl"
    ordered = [episodes[t.id] for t in tasks if t.id in episodes]
    out.write_text("".join(json.dumps(e) + "\n" for e in ordered))
    print(f"{len(episodes)} of {len(tasks)} tasks recorded and rewarded -> {out}", flush=True)
    return out


def _call_message(command: str) -> dict[str, Any]:
    call = {
        "id": "call_submit",
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


async def _rewarded_tasks(db: Path) -> set[str]:
    from rolltap.store import Store

    store = await Store.connect(f"sqlite:///{db}")
    try:
        rollouts = await store.rollouts(limit=100000)
        return {r.task_id for r in rollouts if r.task_id and (r.reward or 0) > 0}
    finally:
        await store.close()


# Training.


@dataclass
class Episode:
    ids: list[int]
    mask: list[bool]
    """True on the tokens the model should learn to write (both answers and their end)."""
    prompt: int
    """Tokens before the first answer: the shared no-gradient prefix."""


def encode(episodes_file: Path, tokenizer: Any, limit: int | None = None) -> list[Episode]:
    """Each recorded episode as the engine renders it, with the two answers marked."""
    from rolltap.chatformat.template import ChatRenderer

    renderer = ChatRenderer(tokenizer)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out: list[Episode] = []
    for line in episodes_file.read_text().splitlines()[:limit]:
        e = json.loads(line)
        messages, tools = e["messages"], e["tools"]
        full = renderer.render(messages, tools, add_generation_prompt=False).token_ids
        mask = [False] * len(full)
        for k, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before = renderer.render(messages[:k], tools, add_generation_prompt=True).token_ids
            upto = renderer.render(messages[: k + 1], tools, add_generation_prompt=False)
            if full[: len(before)] != before:
                raise ValueError(f"{e['task']}: the prompt of answer {k} is not a prefix")
            stop = len(upto.token_ids)
            while stop > 0 and full[stop - 1] != end:
                stop -= 1
            for i in range(len(before), stop):
                mask[i] = True
        out.append(Episode(full, mask, mask.index(True)))
    return out


class LoRALinear:
    """Wraps a frozen nn.Linear: y = W x + scale * B (A x)."""

    @staticmethod
    def wrap(linear: Any, rank: int, alpha: float, gen: Any) -> Any:
        import torch
        from torch import nn

        class _LoRA(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.base = linear
                self.lora_A = nn.Parameter(
                    torch.randn(rank, linear.in_features, generator=gen) / math.sqrt(rank)
                )
                self.lora_B = nn.Parameter(torch.zeros(linear.out_features, rank))
                self.scale = alpha / rank

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                base: torch.Tensor = self.base(x)
                return base + (x @ self.lora_A.T @ self.lora_B.T) * self.scale

        return _LoRA()


@contextlib.contextmanager
def _only_layers(model: Any, layers: Any, renumber: bool) -> Iterator[None]:
    """Run `model.model` with only `layers` (and, for the lower part, no final norm)."""
    import torch

    inner = model.model
    saved_layers, saved_norm = inner.layers, inner.norm
    indices = [layer.self_attn.layer_idx for layer in layers]
    inner.layers = torch.nn.ModuleList(layers)
    if renumber:
        for i, layer in enumerate(layers):
            layer.self_attn.layer_idx = i
    else:
        inner.norm = torch.nn.Identity()
    try:
        yield
    finally:
        inner.layers, inner.norm = saved_layers, saved_norm
        for layer, index in zip(layers, indices, strict=True):
            layer.self_attn.layer_idx = index


def train(
    episodes_file: Path,
    out: Path,
    seed: int,
    rank: int,
    alpha: float,
    top_layers: int,
    epochs: int,
    lr: float,
    limit: int | None,
    stop_after: int | None = None,
    fresh_epochs: int = 1,
) -> None:
    import torch
    from safetensors.torch import save
    from transformers import DynamicCache

    from rolltap.engine.model import load_model, resolve_model

    torch.manual_seed(seed)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    lm = load_model(resolve_model(None))
    model, tokenizer = lm.model, lm.tokenizer
    model.train(False)
    for p in model.parameters():
        p.requires_grad_(False)
    episodes = encode(episodes_file, tokenizer, limit)
    answers = sum(sum(e.mask) for e in episodes)
    longest = max(len(e.ids) for e in episodes)
    print(f"{len(episodes)} episodes, {answers} answer tokens, longest {longest}", flush=True)

    layers = list(model.model.layers)
    split = len(layers) - top_layers
    lower, upper = layers[:split], layers[split:]
    adapters: dict[str, Any] = {}
    for i, layer in enumerate(upper, start=split):
        for part in (layer.self_attn, layer.mlp):
            for name in TARGETS:
                if hasattr(part, name):
                    wrapped = LoRALinear.wrap(getattr(part, name), rank, alpha, gen)
                    setattr(part, name, wrapped)
                    kind = "self_attn" if part is layer.self_attn else "mlp"
                    adapters[f"model.layers.{i}.{kind}.{name}"] = wrapped
    params = [p for a in adapters.values() for p in (a.lora_A, a.lora_B)]
    print(
        f"LoRA rank {rank} on {len(adapters)} projections of layers {split}-{len(layers) - 1}: "
        f"{sum(p.numel() for p in params):,} parameters",
        flush=True,
    )

    started = time.monotonic()
    hidden: list[torch.Tensor] = []
    with torch.no_grad(), _only_layers(model, lower, renumber=False):
        for e in episodes:
            ids = torch.tensor([e.ids])
            hidden.append(model.model(input_ids=ids, use_cache=False).last_hidden_state)
    print(f"lower layers precomputed in {time.monotonic() - started:.0f}s", flush=True)

    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    steps = epochs * len(episodes)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 10) * max(0.05, 1 - s / steps)
    )
    step = 0
    # The prompt's keys and values in the adapted layers (about 1,000 tokens, most of a step's
    # work) are computed with the adapter as it is during the first `fresh_epochs` epochs and
    # kept; later epochs reuse the last kept copy (at most an epoch stale) at half the cost.
    prompts: dict[int, Any] = {}
    with _only_layers(model, upper, renumber=True):
        for epoch in range(stop_after or epochs):
            order = list(range(len(episodes)))
            rng.shuffle(order)
            total, count = 0.0, 0
            for k in order:
                e, h = episodes[k], hidden[k]
                if epoch < fresh_epochs or k not in prompts:
                    cache = DynamicCache()
                    with torch.no_grad():
                        model.model(
                            inputs_embeds=h[:, : e.prompt], past_key_values=cache, use_cache=True
                        )
                    prompts[k] = copy.deepcopy(cache)
                else:
                    cache = copy.deepcopy(prompts[k])
                rest = model.model(
                    inputs_embeds=h[:, e.prompt :], past_key_values=cache, use_cache=True
                ).last_hidden_state
                logits = model.lm_head(rest[:, :-1])
                targets = torch.tensor(e.ids[e.prompt + 1 :])
                keep = torch.tensor(e.mask[e.prompt + 1 :])
                loss = torch.nn.functional.cross_entropy(logits[0][keep], targets[keep])
                optimizer.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                schedule.step()
                step += 1
                total, count = total + loss.item(), count + 1
                if count % 10 == 0:
                    elapsed = time.monotonic() - started
                    print(f"  step {step}: loss {total / count:.4f} ({elapsed:.0f}s)", flush=True)
            elapsed = time.monotonic() - started
            print(
                f"epoch {epoch + 1}/{epochs}: mean loss {total / count:.4f} ({elapsed:.0f}s)",
                flush=True,
            )

    tensors: dict[str, torch.Tensor] = {}
    for name, a in adapters.items():
        tensors[f"{name}.lora_A"] = a.lora_A.detach().to(torch.float16).contiguous()
        tensors[f"{name}.lora_B"] = a.lora_B.detach().to(torch.float16).contiguous()
    meta = {
        "format": "rolltap-lora",
        "base": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "rank": str(rank),
        "alpha": str(alpha),
        "seed": str(seed),
        "episodes": str(len(episodes)),
        "epochs": str(epochs),
        "steps": str(step),
        "lr": str(lr),
        "fresh_epochs": str(fresh_epochs),
        "made_by": "examples/mswea_adapter.py",
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(_sorted_header(save(tensors, metadata=meta)))
    size = out.stat().st_size / 2**20
    print(f"wrote {out} ({size:.1f} MiB) in {time.monotonic() - started:.0f}s", flush=True)


def _sorted_header(data: bytes) -> bytes:
    """The file with its JSON header's keys sorted: safetensors writes them in hash-map order,
    which changes from run to run, so equal tensors would make unequal files."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    if len(text) > size:
        raise ValueError("the sorted safetensors header is longer than the original")
    return data[:8] + text + b" " * (size - len(text)) + data[8 + size :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "step", nargs="?", default="all", choices=["all", "tasks", "record", "train"]
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/mswea-adapter"))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--tasks", type=int, default=200, help="training tasks to generate")
    parser.add_argument("--sandbox", default="bwrap")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=16.0)
    parser.add_argument("--top-layers", type=int, default=8, help="layers that get LoRA")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--limit", type=int, default=36, help="train on the first N episodes")
    parser.add_argument(
        "--fresh-epochs",
        type=int,
        default=1,
        help="epochs that recompute each prompt with the current adapter (later ones reuse it)",
    )
    parser.add_argument(
        "--stop-after",
        type=int,
        default=None,
        help="save after this many epochs (the learning rate still decays over --epochs)",
    )
    args = parser.parse_args()
    tasks = make_tasks(args.tasks, args.seed)
    episodes = args.work / "episodes.jsonl"
    if args.step == "tasks":
        args.work.mkdir(parents=True, exist_ok=True)
        (args.work / "train_tasks.jsonl").write_text("".join(t.as_jsonl() + "\n" for t in tasks))
        return
    if args.step in ("all", "record"):
        record(tasks, args.work, args.sandbox, args.concurrency)
    if args.step in ("all", "train"):
        train(
            episodes,
            args.out,
            args.seed,
            args.rank,
            args.alpha,
            args.top_layers,
            args.epochs,
            args.lr,
            args.limit,
            args.stop_after,
            args.fresh_epochs,
        )


if __name__ == "__main__":
    main()
