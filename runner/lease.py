"""One process runs a batch at a time: the batch's lease in the store (store/leases.py).

`rolltap run` (and `run_batch`) holds its batch's lease for as long as it runs, renewing a
heartbeat; a second run of the same batch against the same store is refused in one line
(`BatchBusy`) or, with `--wait`, waits for the lease. A holder is gone when its process is
(same host: that pid is dead or is another process now) or when its heartbeat has not been
renewed for `stale_after` seconds (a holder on another host, or a frozen one); the next run
takes the lease over and sweeps the sandboxes the gone holder left (their folders and
containers carry its token: `sandbox_run_id`).

Two runs of one batch name against two stores hold two leases, and their sandboxes carry two
tokens, so neither touches the other's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from ..store import Store
from ..store.ids import new_id
from ..store.leases import Holder, Lease

HEARTBEAT_S = 5.0
"""How often a holder renews its lease."""
STALE_AFTER_S = 60.0
"""A lease not renewed for this long is gone, wherever its holder runs."""
WAIT_POLL_S = 2.0


class BatchBusy(Exception):
    """The batch is being run by another process (the CLI prints the message as one line)."""


class LeaseLost(Exception):
    """Another process took this run's lease over (its heartbeat stalled past stale_after)."""


@dataclass(frozen=True)
class Held:
    """A lease this process holds: its token keys this run's sandboxes; `leftovers` are the
    sandbox run ids of the gone holder it took over from (to sweep)."""

    batch_id: str
    token: str
    leftovers: tuple[str, ...]

    @property
    def sandbox_run_id(self) -> str:
        return sandbox_run_id(self.batch_id, self.token)


def sandbox_run_id(batch_id: str, token: str) -> str:
    """What one run's sandboxes of a batch are labelled with (runner/sandboxes: `run_id`)."""
    return f"{batch_id}.{token}"


def this_process() -> Holder:
    return Holder(new_id(), socket.gethostname(), os.getpid(), process_start(os.getpid()))


def process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat): with
    the pid, it names one process even after the pid is reused. "" where /proc has none."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return ""
    # The command name (field 2) is in parentheses and may itself hold spaces or ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else ""


def is_gone(lease: Lease, *, now: datetime, stale_after: float = STALE_AFTER_S) -> bool:
    """Whether the lease's holder no longer runs the batch."""
    beat = (
        lease.heartbeat_at if lease.heartbeat_at.tzinfo else lease.heartbeat_at.replace(tzinfo=UTC)
    )
    if (now - beat).total_seconds() > stale_after:
        return True
    holder = lease.holder
    if holder.host != socket.gethostname():
        return False
    if holder.pid == os.getpid():
        # This process, another run in it (run_batch twice at once): alive.
        return False
    started = process_start(holder.pid)
    return started == "" or (holder.process_start != "" and started != holder.process_start)


def busy_line(lease: Lease) -> str:
    since = lease.acquired_at.strftime("%Y-%m-%d %H:%M:%S")
    h = lease.holder
    return (
        f"batch {lease.batch_id} is being run by pid {h.pid} on {h.host} since {since} UTC: "
        "wait for it (--wait), or give another --batch name"
    )


@contextlib.asynccontextmanager
async def batch_lease(
    store: Store,
    batch_id: str,
    *,
    wait: bool = False,
    say: Callable[[str], None] = lambda _: None,
    heartbeat: float = HEARTBEAT_S,
    stale_after: float = STALE_AFTER_S,
) -> AsyncIterator[Held]:
    """Hold the batch's lease while the body runs (BatchBusy at once, or wait for it). The
    body is cancelled, and LeaseLost raised, if another process takes the lease over."""
    holder = this_process()

    def gone(lease: Lease) -> bool:
        return is_gone(lease, now=datetime.now(UTC), stale_after=stale_after)

    told = False
    while True:
        taken = await store.take_lease(batch_id, holder, gone)
        if taken.won:
            break
        if not wait:
            raise BatchBusy(busy_line(taken.lease))
        if not told:
            say(f"waiting: {busy_line(taken.lease).partition(':')[0]}")
            told = True
        await asyncio.sleep(WAIT_POLL_S)
    replaced = taken.replaced
    if replaced is not None:
        say(f"batch {batch_id}: its last run (pid {replaced.pid} on {replaced.host}) is gone")
    leftovers = () if replaced is None else (sandbox_run_id(batch_id, replaced.token),)
    held = Held(batch_id, holder.token, leftovers)
    body = asyncio.current_task()
    lost = False

    async def keep() -> None:
        nonlocal lost
        last = time.monotonic()
        while True:
            await asyncio.sleep(heartbeat)
            try:
                mine = await store.beat_lease(batch_id, holder.token)
            except Exception:  # the store is down: try again until stale_after judges
                if time.monotonic() - last < stale_after:
                    continue
                mine = False
            if not mine:
                lost = True
                if body is not None:
                    body.cancel()
                return
            last = time.monotonic()

    keeper = asyncio.get_running_loop().create_task(keep())
    try:
        yield held
    except asyncio.CancelledError:
        if lost:
            raise LeaseLost(
                f"batch {batch_id}: another run took it over (this run's heartbeat stalled "
                f"over {stale_after:.0f} s); stopped"
            ) from None
        raise
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        if not lost:
            with contextlib.suppress(Exception):
                await store.release_lease(batch_id, holder.token)
