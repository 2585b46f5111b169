"""New weights from disk, checked against the served model before anything of it changes.

`model_path` (SGLang's `update_weights_from_disk` field) may be a safetensors file, a torch state
dict (`.pt`, `.pth`, `.bin`; read with `weights_only=True`, so it cannot run code), or a
directory holding either (a `save_pretrained` directory, sharded or not). Every tensor must name
a parameter of the model with its shape; every parameter must be given, except one that shares
its storage with another given one (tied embeddings: `save_pretrained` writes `lm_head.weight`
only once, as `model.embed_tokens.weight`). Reading and checking happen off the scheduler
thread; only the copy into the model runs between two forward passes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .errors import BadRequest

LOAD_FORMATS = ("auto", "safetensors", "pt")
_TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def read_weights(model_path: str, model: Any, load_format: str = "auto") -> dict[str, torch.Tensor]:
    """The tensors at `model_path`, checked against `model` and cast to its dtype and device."""
    if load_format not in LOAD_FORMATS:
        raise BadRequest(f"`load_format` must be one of {', '.join(LOAD_FORMATS)}", "load_format")
    files = _weight_files(Path(model_path), load_format)
    given: dict[str, torch.Tensor] = {}
    for file in files:
        given.update(_read_file(file))
    return _checked(given, model)


def copier(model: Any, tensors: dict[str, torch.Tensor]) -> Callable[[], None]:
    """A function that copies `tensors` into `model` in place (for the scheduler thread)."""
    targets = model.state_dict()

    def apply() -> None:
        with torch.no_grad():
            for name, tensor in tensors.items():
                targets[name].copy_(tensor)

    return apply


def _weight_files(path: Path, load_format: str) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise BadRequest(f"`model_path` {str(path)!r} is neither a file nor a directory")
    found: list[Path] = []
    if load_format in ("auto", "safetensors"):
        found = sorted(path.glob("*.safetensors"))
    if not found and load_format in ("auto", "pt"):
        found = sorted(p for p in path.iterdir() if p.suffix in _TORCH_SUFFIXES and p.is_file())
    if not found:
        raise BadRequest(f"`model_path` {str(path)!r} holds no .safetensors or .pt/.bin file")
    return found


def _read_file(file: Path) -> dict[str, torch.Tensor]:
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            return dict(load_file(str(file), device="cpu"))
        if file.suffix in _TORCH_SUFFIXES:
            loaded = torch.load(file, map_location="cpu", weights_only=True)
            if not isinstance(loaded, dict) or not all(
                isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()
            ):
                raise BadRequest(f"{file.name} does not hold a state dict (name -> tensor)")
            return loaded
    except BadRequest:
        raise
    except Exception as e:
        raise BadRequest(f"cannot read weights from {file.name}: {e}") from None
    raise BadRequest(f"{file.name}: expected .safetensors, .pt, .pth or .bin")


def _checked(given: dict[str, torch.Tensor], model: Any) -> dict[str, torch.Tensor]:
    current: dict[str, torch.Tensor] = model.state_dict()
    checked: dict[str, torch.Tensor] = {}
    for name, tensor in given.items():
        target = current.get(name)
        if target is None:
            raise BadRequest(f"the weights name a tensor the model does not have: {name}")
        if tuple(tensor.shape) != tuple(target.shape):
            raise BadRequest(
                f"{name}: shape {tuple(tensor.shape)} where the model has {tuple(target.shape)}"
            )
        if not (tensor.is_floating_point() or tensor.dtype == target.dtype):
            raise BadRequest(f"{name}: dtype {tensor.dtype} where the model has {target.dtype}")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise BadRequest(f"{name}: holds NaN or infinite values")
        checked[name] = tensor.to(dtype=target.dtype, device=target.device)
    storage: dict[int, list[str]] = {}
    for name, tensor in current.items():
        storage.setdefault(tensor.data_ptr(), []).append(name)
    missing = [names[0] for names in storage.values() if not any(n in given for n in names)]
    if missing:
        raise BadRequest(f"the weights leave out parameters of the model: {missing[:5]}")
    return checked
