"""The o200k vocabulary gpt-oss's Harmony encoding loads, offline.

openai-harmony downloads `o200k_base.tiktoken` on first use, or reads it from the folder in
`TIKTOKEN_ENCODINGS_BASE`. The quicktok-v1 package ships the same ranks in its own binary
layout (u32 count, then per token: u16 length, its bytes, u32 rank); written back as tiktoken's
text file they must hash to tiktoken's published SHA-256, or nothing is used.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import struct
from pathlib import Path

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
NAME = "o200k_base.tiktoken"


def install(folder: Path) -> str | None:
    """Point openai-harmony at an o200k vocabulary in `folder`; why not, when it cannot."""
    if os.environ.get("TIKTOKEN_ENCODINGS_BASE"):
        return None
    target = folder / NAME
    if not target.exists():
        spec = importlib.util.find_spec("quicktok")
        if spec is None or not spec.submodule_search_locations:
            return "quicktok-v1 (the o200k vocabulary, offline) is not installed"
        source = Path(next(iter(spec.submodule_search_locations))) / "data" / "o200k.vocab"
        data = source.read_bytes()
        (count,) = struct.unpack_from("<I", data, 0)
        at, lines = 4, []
        for _ in range(count):
            (size,) = struct.unpack_from("<H", data, at)
            token = data[at + 2 : at + 2 + size]
            (rank,) = struct.unpack_from("<I", data, at + 2 + size)
            at += 6 + size
            lines.append(base64.b64encode(token) + b" " + str(rank).encode() + b"\n")
        text = b"".join(lines)
        if hashlib.sha256(text).hexdigest() != O200K_SHA256:
            return "quicktok-v1's o200k vocabulary is not tiktoken's (SHA-256 differs)"
        folder.mkdir(parents=True, exist_ok=True)
        target.write_bytes(text)
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
    return None
