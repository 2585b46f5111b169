"""Signed exports: a manifest beside an export that says what it holds, under an HMAC.

`rolltap export --sign` writes `<export>.sig` (for a file or a directory of files):

    {"format": "rolltap-export-signature/1", "algorithm": "HMAC-SHA256",
     "key_id": "<first 16 hex of SHA-256 of the key>", "created_at": "<ISO 8601 UTC>",
     "export": {"format": "parquet", "name": "batch.parquet", "kind": "file"},
     "files": [{"path": "batch.parquet", "sha256": "..."}],
     "rollouts": [{"id": "...", "status": "...", "reward": 1.0, "calls": 12,
                   "chain_hash": "<hash of call seq 12>", "head_hash": "...", "head_seq": 12}],
     "mac": "<hex HMAC-SHA256 of the canonical JSON of everything else>"}

Canonical JSON: keys sorted, separators `,` and `:`, UTF-8. `files` paths are relative to the
export's directory (a file export lists just its own name). The key comes from the proxy's secret
(proxy/secret.py `export_key`), so only someone holding it can sign; `chain_hash` and
`head_hash` tie the export to the store's hash chains (store/chain.py).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..store.records import RolloutView

FORMAT = "rolltap-export-signature/1"
SUFFIX = ".sig"


def signature_path(export: Path) -> Path:
    return export.with_name(export.name + SUFFIX)


def key_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:16]


def sign(
    export: Path,
    fmt: str,
    rollouts: Sequence[RolloutView],
    chain_hashes: dict[str, str | None],
    key: bytes,
) -> Path:
    """Write the signed manifest of `export` (a file, or a directory of files) beside it."""
    if not export.exists():
        raise FileNotFoundError(f"nothing to sign at {export}")
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "algorithm": "HMAC-SHA256",
        "key_id": key_id(key),
        "created_at": datetime.now(UTC).isoformat(),
        "export": {
            "format": fmt,
            "name": export.name,
            "kind": "directory" if export.is_dir() else "file",
        },
        "files": [{"path": p, "sha256": d} for p, d in _digests(export).items()],
        "rollouts": [
            {
                "id": r.id,
                "status": r.status.value,
                "reward": r.reward,
                "calls": r.n_calls,
                "chain_hash": chain_hashes.get(r.id),
                "head_hash": r.head_hash,
                "head_seq": r.head_seq,
            }
            for r in rollouts
        ],
    }
    manifest["mac"] = _mac(key, manifest)
    path = signature_path(export)
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return path


@dataclass
class SignatureCheck:
    """What checking an export against its manifest found (the store is checked separately)."""

    manifest: dict[str, Any]
    signed: bool
    """The MAC holds under the key given."""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.signed and not self.problems


class BadManifest(ValueError):
    """The .sig file is missing or is not a rolltap export signature."""


def locate(path: Path) -> tuple[Path, Path]:
    """(export, manifest) for a path naming either of them."""
    if path.name.endswith(SUFFIX):
        return path.with_name(path.name[: -len(SUFFIX)]), path
    return path, signature_path(path)


def read(path: Path) -> tuple[Path, dict[str, Any]]:
    """(the export, its manifest) for a path naming either of them."""
    export, manifest_path = locate(path)
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise BadManifest(f"no signature at {manifest_path} (export with --sign)") from None
    except (OSError, ValueError) as e:
        raise BadManifest(f"{manifest_path} is not readable JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BadManifest(f"{manifest_path} is not a rolltap export signature ({FORMAT})")
    return export, manifest


def check(export: Path, manifest: dict[str, Any], key: bytes) -> SignatureCheck:
    """The manifest's MAC under `key`, and the export's files against it."""
    manifest = dict(manifest)
    mac = manifest.pop("mac", None)
    signed = isinstance(mac, str) and hmac.compare_digest(_mac(key, manifest), mac)
    result = SignatureCheck(manifest, signed=signed)
    if not result.signed:
        if manifest.get("key_id") != key_id(key):
            result.problems.append(
                f"signed with another secret (key {manifest.get('key_id')}, this one is "
                f"{key_id(key)}): pass the proxy's --secret that signed it"
            )
        else:
            result.problems.append("the signature does not match: the manifest was altered")
    if not export.exists():
        result.problems.append(f"the export {export} is missing")
        return result
    listed = {f["path"]: f["sha256"] for f in manifest.get("files", [])}
    found = _digests(export)
    for name, digest in sorted(listed.items()):
        if name not in found:
            result.problems.append(f"{name}: missing from the export")
        elif found[name] != digest:
            result.problems.append(f"{name}: changed since it was signed")
    for name in sorted(set(found) - set(listed)):
        result.problems.append(f"{name}: not part of the signed export")
    return result


def _mac(key: bytes, manifest: dict[str, Any]) -> str:
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hmac.new(key, canonical.encode(), hashlib.sha256).hexdigest()


def _digests(export: Path) -> dict[str, str]:
    if export.is_file():
        return {export.name: _sha256(export)}
    return {
        p.relative_to(export).as_posix(): _sha256(p)
        for p in sorted(export.rglob("*"))
        if p.is_file()
    }


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
