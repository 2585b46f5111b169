"""`rolltap serve --workers N`: N proxy processes on one port, each with its own event loop and
store writer, so capture and streaming use N cores.

Every worker binds the port with SO_REUSEPORT and the kernel spreads new connections over them.
A worker is a whole proxy; workers share what replicas share (proxy/control/replicated.py): on
PostgreSQL, pause and weight updates reach every worker. On SQLite they share the file (each
commit takes its write lock in turn) but have no channel between them, so pause and weight
updates are refused there (409): they would hold one worker in N. The sandboxes' unix socket is
served by worker 0 (a unix socket cannot be shared like a port).

The parent prepares what must happen once (the database migrated, the signing secret created,
the built-in engine started), forks the workers before any event loop runs in it, and stops them
all when it is told to stop or when one of them exits.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from types import FrameType


def run_workers(n: int, worker: Callable[[int], None]) -> int:
    """Run `worker(i)` for i in 0..n-1, each in a forked process; the exit status to use."""
    fork = multiprocessing.get_context("fork")
    processes = [
        fork.Process(target=worker, args=(i,), name=f"rolltap-worker-{i}") for i in range(n)
    ]
    for process in processes:
        process.start()
    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        _terminate(processes)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        wait([p.sentinel for p in processes])
        failed = not stopping
        # One worker gone unasked: the port would answer with fewer cores and no one would
        # know; stop the rest so a supervisor restarts the whole proxy.
        _terminate(processes)
        for process in processes:
            process.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    codes = [p.exitcode or 0 for p in processes]
    return 1 if failed or any(c > 0 for c in codes) else 0


def _terminate(processes: Sequence[multiprocessing.process.BaseProcess]) -> None:
    for process in processes:
        if process.is_alive() and process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
