"""Weights for weight-update tests: the served SmolLM2's own tensors, and changed copies of them.

The engine keeps a dequantized copy of its GGUF model as a safetensors directory (the GGUF
cache); after any engine has started once, that file holds exactly the weights it serves.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rolltap.engine.gguf_cache import lookup
from rolltap.engine.model import default_gguf_path

CHANGED = "model.norm.weight"
"""The tensor `changed_weights` scales: the final norm moves every logit, cheaply."""


def served_weights() -> dict[str, torch.Tensor]:
    entry = lookup(default_gguf_path())
    assert entry is not None, "start an engine first: it writes the dequantized cache"
    return load_file(str(entry / "model.safetensors"))


def save_weights(tensors: dict[str, torch.Tensor], directory: Path) -> Path:
    """A save_pretrained-like directory holding `tensors` as one safetensors file."""
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    return directory


def changed_weights(scale: float) -> dict[str, torch.Tensor]:
    tensors = dict(served_weights())
    tensors[CHANGED] = tensors[CHANGED] * scale
    return tensors
