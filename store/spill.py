"""Where the records of sampled calls go when the store stayed away past its outage limit.

A call the engine answered has a record even when the database could not take it in time (a
full disk, a server gone for minutes): its client is answered with an error once the outage
limit passes, and the writer hands its record here, a file in a folder of its own (best on
another filesystem than the database's). Once the database takes writes again, the writer
writes the spilled records into it, marked as spilled (their client saw an error, not their
answer: they are `failed`, with the answer kept), and removes the file.

The files are pickles of store/records.py's CallRecord, written by this process for this
process: never load a spill folder someone else could write to.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import platformdirs

from .enums import CallStatus
from .ids import new_id
from .records import CallRecord

log = logging.getLogger(__name__)

SPILLED = (
    "spilled: the store stayed unreachable past its outage limit, so the client got an error "
    "instead of this answer; written once the store was back"
)


def spill_root(given: str | Path | None = None) -> Path:
    """`serve --store-spill`, else a folder in the user's cache: most often not the disk the
    store's own data is on, and never a folder others can write to (spills are pickles). Every
    process that records sampled calls spills there: serve, `rolltap run`'s own proxy, the
    rollout service and each cluster node."""
    return Path(given) if given else platformdirs.user_cache_path("rolltap") / "spill"


def folder_for(root: Path, store_url: str) -> Path:
    """One folder per store under `root`, so two stores' spills never mix."""
    return root / hashlib.sha256(store_url.encode()).hexdigest()[:16]


class Spill:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def keep(self, records: list[CallRecord]) -> Path:
        """Write `records` durably (fsync, then an atomic rename); raises OSError if it cannot."""
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        final = self.folder / f"{new_id()}.spill"
        partial = final.with_suffix(".partial")
        marked = [_as_spilled(r) for r in records]
        with partial.open("wb") as f:
            pickle.dump(marked, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        partial.rename(final)
        with contextlib.suppress(OSError):
            descriptor = os.open(self.folder, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        return final

    def files(self) -> Iterator[Path]:
        """The spilled files, oldest first (their names are ULIDs)."""
        if self.folder.is_dir():
            yield from sorted(self.folder.glob("*.spill"))

    def load(self, path: Path) -> list[CallRecord]:
        with path.open("rb") as f:
            records: list[CallRecord] = pickle.load(f)
        return records

    def written(self, path: Path) -> None:
        """Its records are in the store: the file goes."""
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _as_spilled(record: CallRecord) -> CallRecord:
    """Its client never saw this answer: failed, the answer kept, and why."""
    error = SPILLED if not record.error else f"{SPILLED}; {record.error}"
    return dataclasses.replace(record, status=CallStatus.FAILED, error=error)
