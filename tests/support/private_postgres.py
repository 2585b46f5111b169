"""A PostgreSQL server of the test's own, so a test may stop and restart it.

The shared server on 5432 serves every other test and must never be stopped; this one lives in a
temporary directory on a free port, started with initdb + pg_ctl (as the `postgres` OS user when
run as root, since initdb refuses root) and removed when the test ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def _pg_bin() -> Path:
    """ROLLTAP_TEST_PG_BIN, else the newest Debian-installed server's binaries."""
    if "ROLLTAP_TEST_PG_BIN" in os.environ:
        return Path(os.environ["ROLLTAP_TEST_PG_BIN"])
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else Path("/usr/lib/postgresql/15/bin")


PG_BIN = _pg_bin()


def private_postgres_unavailable_reason() -> str | None:
    if not (PG_BIN / "initdb").exists():
        return f"no initdb in {PG_BIN} (set ROLLTAP_TEST_PG_BIN)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root needs runuser to start PostgreSQL as the postgres user"
    return None


@dataclass
class PrivatePostgres:
    data: Path
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.log), "-o", self._options())

    def stop(self) -> None:
        """Fast shutdown: clients are disconnected at once, as in a real outage."""
        self._pg_ctl("stop", "-w", "-m", "fast")

    def _options(self) -> str:
        return (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.data}"
        )

    def _pg_ctl(self, *args: str) -> None:
        _run_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), *args])


def _run_as_postgres(argv: list[str]) -> None:
    if os.geteuid() == 0:
        argv = ["runuser", "-u", "postgres", "--", *argv]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def private_postgres(under: Path | None = None) -> Iterator[PrivatePostgres]:
    """`under`: the folder (a filesystem of the test's own, say) its data directory goes in."""
    root = Path(tempfile.mkdtemp(prefix="rolltap-pg-", dir=under))
    try:
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
        data = root / "data"
        _run_as_postgres(
            [str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-N"]
        )
        server = PrivatePostgres(data, _free_port(), root / "server.log")
        server.start()
        try:
            yield server
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):
                server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
