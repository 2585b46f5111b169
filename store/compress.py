"""Request and response bodies, compressed at rest (JSON shrinks 4-10x).

New bodies are zstd frames; bodies stored before were zlib streams and still read. The two tell
themselves apart by their first bytes: a zstd frame opens with its magic number, which no zlib
header can (a zlib stream's first byte is 0x?8, zstd's is 0x28 followed by 0xB5).
"""

from __future__ import annotations

import threading
import zlib

import zstandard

# Level 1: zlib level 1's ratio on these bodies at half its CPU; every call compresses three
# before its record is durable.
_LEVEL = 1
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
UNREADABLE = (zlib.error, zstandard.ZstdError)
"""What inflating a damaged body raises."""

# A context per thread: zstandard's are not safe to share, and reusing one spares the setup
# that dominates compressing a few kilobytes (zlib allocates and clears its tables every time).
_local = threading.local()


def deflate(data: bytes | None) -> bytes | None:
    if data is None:
        return None
    compressor: zstandard.ZstdCompressor | None = getattr(_local, "compressor", None)
    if compressor is None:
        compressor = _local.compressor = zstandard.ZstdCompressor(level=_LEVEL)
    return compressor.compress(data)


def inflate(data: bytes | None) -> bytes | None:
    if data is None:
        return None
    if not data.startswith(_ZSTD_MAGIC):
        return zlib.decompress(data)
    decompressor: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
    if decompressor is None:
        decompressor = _local.decompressor = zstandard.ZstdDecompressor()
    return decompressor.decompress(data)
