"""A low-rank delta (LoRA) merged into the served weights at load time, with plain torch.

The file is safetensors: for each adapted linear layer `<module>.lora_A` (rank x in) and
`<module>.lora_B` (out x rank), `<module>` a name in the model's state dict without `.weight`,
and `alpha` and `rank` in the metadata. Loading adds alpha / rank * B @ A to each weight once,
so serving costs nothing extra and the engine's logprobs are a plain forward pass of the merged
weights (what a trainer that loads the same file and merges it computes).

rolltap ships one adapter for its default model (adapters/, made by examples/mswea_adapter.py):
SmolLM2-135M-Instruct taught the action mini-swe-agent asks for. `rolltap demo` and `rolltap run`
use it on the default model unless given `--adapter none`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import ModelLoadError

ADAPTERS = Path(__file__).resolve().parent / "adapters"
DEFAULT_ADAPTER = ADAPTERS / "smollm2-135m-mswea.safetensors"
"""The adapter `rolltap demo` and `rolltap run` load on the default model."""
NONE = "none"
DEFAULT = "default"
"""`--adapter` values: no adapter; the shipped one (for the default model only)."""


def resolve_adapter(value: str | None) -> Path | None:
    """`--adapter` (a path, `default` or `none`) to an adapter file, or None for none; the
    file's header is checked here, so a wrong file fails before any model loads."""
    if value is None or value.lower() == NONE:
        return None
    path = DEFAULT_ADAPTER if value.lower() == DEFAULT else Path(value).expanduser()
    if not path.is_file():
        raise ModelLoadError(
            f"adapter {str(path)!r} is not a file (give a .safetensors LoRA file, `default` "
            f"for rolltap's own, or `none` for the plain model)"
        )
    _scale(_header(path).get("__metadata__"), path)
    return path.resolve()


def _header(path: Path) -> dict[str, Any]:
    """A safetensors file's JSON header (8 bytes of little-endian length, then the JSON)."""
    try:
        with path.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 2 <= size <= 100 * 2**20:
                raise ValueError("no safetensors header")
            header = json.loads(f.read(size))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"adapter {str(path)!r} is not a safetensors file ({e})") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"adapter {str(path)!r} is not a safetensors file")
    return header


def _scale(meta: object, path: Path) -> float:
    """alpha / rank from the file's metadata."""
    try:
        return float(meta["alpha"]) / float(meta["rank"])  # type: ignore[index]
    except (TypeError, KeyError, ValueError, ZeroDivisionError):
        raise ModelLoadError(
            f"adapter {str(path)!r} has no `alpha` and `rank` in its metadata"
        ) from None


def read_adapter(path: Path) -> tuple[dict[str, Any], float]:
    """The file's tensors and its scale alpha / rank; ModelLoadError when it is not an adapter."""
    try:
        from safetensors import safe_open
    except ImportError as e:  # pragma: no cover - safetensors comes with transformers
        raise ModelLoadError(f"reading an adapter needs safetensors ({e})") from e
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    except Exception as e:
        raise ModelLoadError(f"adapter {str(path)!r} is not a safetensors file: {e}") from None
    return tensors, _scale(meta, path)


def merge_adapter(model: Any, path: Path) -> int:
    """Add the adapter's delta to `model`'s weights in place; returns how many it changed."""
    import torch

    tensors, scale = read_adapter(path)
    weights: dict[str, torch.Tensor] = dict(model.named_parameters())
    modules = sorted({name.rsplit(".", 1)[0] for name in tensors})
    for module in modules:
        a, b = tensors.get(f"{module}.lora_A"), tensors.get(f"{module}.lora_B")
        weight = weights.get(f"{module}.weight")
        if a is None or b is None:
            raise ModelLoadError(f"adapter {path.name}: {module} lacks lora_A or lora_B")
        if weight is None:
            raise ModelLoadError(f"adapter {path.name}: the model has no layer {module}")
        if a.dim() != 2 or b.dim() != 2 or (b.shape[0], a.shape[1]) != tuple(weight.shape):
            raise ModelLoadError(
                f"adapter {path.name}: {module} is {tuple(b.shape)} x {tuple(a.shape)}, "
                f"the model's weight {tuple(weight.shape)}"
            )
        delta = (b.to(torch.float32) @ a.to(torch.float32)) * scale
        with torch.no_grad():
            weight.add_(delta.to(dtype=weight.dtype, device=weight.device))
    return len(modules)
