"""Runs one host process for a sandbox: output captured and streamed, process tree killed at the
timeout or when the caller is cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from .base import TIMEOUT_EXIT_CODE, ExecResult
from .errors import SandboxExecError
from .identity import SandboxUser
from .reaper import descendants

CHUNK = 1 << 16
# After the kill, output pipes close once every holder is dead; one that escaped the process
# group (local kind only) could hold them open for ever, so stop reading after this long.
DRAIN_GRACE_SEC = 2.0
EXIT_POLL_SEC = 0.1


async def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path | None = None,
    stdin: bytes | None = None,
    timeout: float | None = None,
    log: Path | None = None,
    kill_leftovers: bool = False,
    user: SandboxUser | None = None,
) -> ExecResult:
    """Runs argv in a new session. kill_leftovers: also kill what the command left running in
    its process group when it exits (kinds without a PID namespace to do that for them). user:
    run it as that user, with no supplementary groups (we are root and it is not)."""
    switch = user if user is not None and user.switches else None
    setpriv = shutil.which("setpriv") if switch else None
    if switch and setpriv:
        # util-linux's setpriv switches in the child it execs: the runner is spawned from as
        # any command is (vfork); Popen's own switch would fork the whole runner (~20 ms).
        ids = ["--reuid", str(switch.uid), "--regid", str(switch.gid), "--clear-groups"]
        argv, switch = [setpriv, *ids, "--", *argv], None
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            user=switch.uid if switch else None,
            group=switch.gid if switch else None,
            extra_groups=[] if switch else None,
        )
    except OSError as e:
        raise SandboxExecError(f"cannot start {argv[0]}: {e.strerror}") from e
    assert proc.stdout is not None
    assert proc.stderr is not None
    out, err = bytearray(), bytearray()
    with open(log, "ab") if log else contextlib.nullcontext() as sink:
        pumps = [
            asyncio.ensure_future(_pump(proc.stdout, out, sink)),
            asyncio.ensure_future(_pump(proc.stderr, err, sink)),
        ]
        feeder = asyncio.ensure_future(_feed(proc.stdin, stdin)) if proc.stdin else None
        timed_out = False
        try:
            try:
                await asyncio.wait_for(_exited(proc), timeout)
            except TimeoutError:
                timed_out = True
                _kill_tree(proc.pid)
                await _exited(proc)
            if kill_leftovers:
                _kill_group(proc.pid)
            await asyncio.wait(pumps, timeout=DRAIN_GRACE_SEC)
        finally:
            if proc.returncode is None:
                _kill_tree(proc.pid)
            for task in (*pumps, feeder):
                if task is not None:
                    task.cancel()
    code = TIMEOUT_EXIT_CODE if timed_out else _exit_code(proc.returncode)
    return ExecResult(code, _text(out), _text(err), timed_out=timed_out)


async def _exited(proc: asyncio.subprocess.Process) -> None:
    """Returns once the process itself exited. Process.wait() also waits for its output pipes
    to close, which a leftover background child can hold open for ever."""
    waiter = asyncio.ensure_future(proc.wait())
    try:
        while proc.returncode is None and not waiter.done():
            await asyncio.wait([waiter], timeout=EXIT_POLL_SEC)
    finally:
        waiter.cancel()


async def _pump(stream: asyncio.StreamReader, buf: bytearray, sink: BinaryIO | None) -> None:
    while chunk := await stream.read(CHUNK):
        buf += chunk
        if sink is not None:
            sink.write(chunk)
            sink.flush()


async def _feed(pipe: asyncio.StreamWriter | None, data: bytes | None) -> None:
    if pipe is None or data is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.write(data)
        await pipe.drain()
        pipe.close()


def _kill_tree(pid: int) -> None:
    """SIGKILLs the process group, then descendants that left it (found through /proc)."""
    found = descendants(pid)
    _kill_group(pid)
    for child in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _exit_code(returncode: int | None) -> int:
    if returncode is None:
        return -1
    return 128 - returncode if returncode < 0 else returncode


def _text(data: bytearray) -> str:
    return data.decode("utf-8", "replace")
