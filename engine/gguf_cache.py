"""A dequantized copy of a GGUF model kept as a Hugging Face directory, so later loads take seconds.

transformers parses a GGUF file three times (tokenizer, config, weights) and maps tensor names
slowly: about 15 s for SmolLM2 on a 2-core CPU against well under a second for safetensors.
The first load writes the dequantized weights (float32, exactly what the GGUF load produced),
the tokenizer and the config next to each other; the entry's name hashes the GGUF's path, size,
mtime and the transformers version, so a changed file or library gets a fresh entry.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import platformdirs

log = logging.getLogger(__name__)

ENV = "ROLLTAP_ENGINE_CACHE"
"""A directory for the cache, or `off` to never cache."""

_COMPLETE = "rolltap-complete"


def cache_root() -> Path | None:
    setting = os.environ.get(ENV, "")
    if setting.lower() in ("off", "0", "false", "no"):
        return None
    return Path(setting) if setting else Path(platformdirs.user_cache_dir("rolltap")) / "engine"


def entry_for(gguf: Path, root: Path) -> Path:
    import transformers

    stat = gguf.stat()
    key = f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{transformers.__version__}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return root / f"{gguf.stem}-{digest}"


def lookup(gguf: Path) -> Path | None:
    """The cached directory for this GGUF file, if a complete one exists."""
    root = cache_root()
    if root is None:
        return None
    entry = entry_for(gguf, root)
    return entry if (entry / _COMPLETE).exists() else None


def store(gguf: Path, model: Any, tokenizer: Any) -> None:
    """Write the loaded model and tokenizer as a cache entry; failures only cost the speed-up."""
    root = cache_root()
    if root is None:
        return
    entry = entry_for(gguf, root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=root))
    except OSError as e:
        log.warning("not caching the dequantized model in %s: %s", root, e)
        return
    try:
        _save_dequantized(model, staging)
        tokenizer.save_pretrained(staging)
        (staging / _COMPLETE).touch()
        # Another process may have finished the same entry first: theirs is as good as ours.
        if not entry.exists():
            staging.rename(entry)
    except (OSError, ValueError) as e:
        log.warning("not caching the dequantized model in %s: %s", entry, e)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _save_dequantized(model: Any, directory: Path) -> None:
    """Save without the GGUF quantizer marks: the weights are plain tensors already, and the
    marks would make transformers refuse to save and, on load, look for a .gguf file."""
    config = model.config
    quantization = getattr(config, "quantization_config", None)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantization is not None:
        del config.quantization_config
    model.hf_quantizer = None
    try:
        model.save_pretrained(directory)
    finally:
        model.hf_quantizer = quantizer
        if quantization is not None:
            config.quantization_config = quantization
