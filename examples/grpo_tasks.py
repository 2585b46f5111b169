"""The GRPO example's tasks (examples/grpo_cpu.py): say a word back, and nothing else.

    python examples/grpo_tasks.py    # rewrites grpo_train.jsonl and grpo_heldout.jsonl beside it

Each task shows a word and asks for it back; its test, run by the verifier in the sandbox the
single-call harness left, passes when answer.txt is exactly that word once punctuation, spaces
and case are set aside. SmolLM2-135M rarely answers so at temperature 1 (fewer than 1 sample
in 100: it says more, or something else), so the reward starts near 0 and what GRPO has to
teach is the answer's shape, a skill rather than a fact. The words are split once, with a fixed
seed, into training words and held-out words that no training task shows.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
SEED = 0
HELDOUT = 24
WORDS = """
anchor apple arrow basket beaver blanket bottle branch bridge bucket button cabin camera candle
canyon carpet castle chair cheese cherry circle cloud coffee cookie copper cotton crayon crystal
desert dinner doctor donkey dragon eagle engine falcon farmer feather finger flower forest
fountain garden garlic ginger glacier goose guitar hammer harbor helmet honey island jacket
jungle kettle ladder lantern lemon letter lizard lobster marble market meadow mirror monkey
motor muffin napkin needle onion orange oyster paper parrot pebble pencil pepper piano pillow
pirate planet pocket potato pumpkin puzzle rabbit rainbow ribbon river rocket saddle salmon
saucer school shadow shovel silk silver sister sparrow spider spoon squirrel statue stone sugar
summer table teacher thunder ticket tiger tomato tower tunnel turtle umbrella valley velvet
violin wagon wallet walnut water whistle window winter wizard yellow zebra
""".split()  # noqa: SIM905 (a list of 132 words reads better as text)


def task(word: str) -> dict[str, Any]:
    return {
        "id": f"say-{word}",
        "instruction": f"{word}\n\nRepeat the word above, and nothing else.",
        "test": (
            "tr -d '[:punct:][:space:]' < answer.txt | tr '[:upper:]' '[:lower:]' "
            f"| grep -qx {word}"
        ),
        "agent_timeout_sec": 300,
    }


def split(seed: int = SEED) -> tuple[list[str], list[str]]:
    """(training words, held-out words)."""
    words = sorted(WORDS)
    random.Random(seed).shuffle(words)
    return words[HELDOUT:], words[:HELDOUT]


def write(directory: Path = HERE) -> None:
    train, heldout = split()
    for name, words in (("grpo_train.jsonl", train), ("grpo_heldout.jsonl", heldout)):
        lines = [json.dumps(task(word)) + "\n" for word in words]
        (directory / name).write_text("".join(lines))


if __name__ == "__main__":
    write()
