"""WAL checkpoints for SQLite on their own thread, off the group-commit writer's path.

SQLite's automatic checkpoint runs inside whichever COMMIT pushes the WAL past 1,000 pages, and
it syncs the database file: that commit takes ~10 ms instead of ~0.3, and every call waiting on
it (the proxy holds each answer's last byte until its record is durable) waits too. The writer's
connection therefore turns automatic checkpoints off and this thread does them, PASSIVE (never
blocking a writer or reader), shortly after commits happen.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

# Commits arriving within this window share one checkpoint.
_COALESCE_S = 0.2
# After a failed checkpoint (a full disk), wait this long before the next, doubling to the max:
# retried at once, a full disk logged it 40 times a second.
_RETRY_S = 0.5
_RETRY_MAX_S = 5.0


class WalCheckpointer:
    def __init__(self, path: Path, busy_timeout_ms: int) -> None:
        self._path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._pending = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._truncate = False
        """The next checkpoint also truncates the WAL file (after a full disk)."""
        self._failing_since: float | None = None
        self._retry_s = _RETRY_S

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="rolltap-wal-checkpoint", daemon=True
        )
        self._thread.start()

    def committed(self) -> None:
        """Called by the writer after each commit; cheap, never blocks."""
        self._pending.set()

    def recovered(self) -> None:
        """The writer commits again after a full disk: checkpoint everything now and give the
        WAL file's space back (TRUNCATE), rather than leave it at its largest."""
        self._truncate = True
        self._pending.set()

    def close(self) -> None:
        """Stop after one last checkpoint of whatever was committed."""
        self._stopping = True
        self._pending.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        conn = sqlite3.connect(self._path, timeout=self._busy_timeout_ms / 1000)
        try:
            while not self._stopping:
                self._pending.wait()
                if not self._stopping:
                    # Let a burst of commits finish first: one checkpoint instead of many.
                    time.sleep(_COALESCE_S)
                self._pending.clear()
                self._checkpoint(conn)
        finally:
            conn.close()

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        truncate, self._truncate = self._truncate, False
        mode = "TRUNCATE" if truncate else "PASSIVE"
        try:
            conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
        except sqlite3.Error as e:
            # A failed checkpoint loses nothing (the WAL keeps the data); a later one retries,
            # after a pause that grows while it keeps failing, and it is said once.
            if self._failing_since is None:
                self._failing_since = time.monotonic()
                log.warning("WAL checkpoint of %s failed: %s; retried", self._path, e)
            self._truncate = self._truncate or truncate
            time.sleep(self._retry_s)
            self._retry_s = min(self._retry_s * 2, _RETRY_MAX_S)
            self._pending.set()
            return
        if self._failing_since is not None:
            log.warning(
                "WAL checkpoint of %s works again after %.1f s",
                self._path,
                time.monotonic() - self._failing_since,
            )
            self._failing_since = None
        self._retry_s = _RETRY_S
