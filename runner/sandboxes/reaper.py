"""Runs a command and, when it exits, kills everything it left behind (stdlib only).

    python3 -I -S reaper.py -- CMD...

The local kind has no PID namespace to end a command's processes with it. This process makes
itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER): a descendant whose parent dies is
re-parented here rather than to init, so a daemon that double-forks, calls setsid or changes
its process group still stays below it. When CMD exits, every process still below is killed,
and this process exits with CMD's status (128 + N for a signal N).

It runs as the command's own user, so the command could kill it first and orphan the rest to
init: the local kind is for development, not for untrusted agents (use bwrap).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> int:
    if argv[:1] != ["--"] or len(argv) < 2:
        sys.stderr.write("usage: reaper.py -- CMD...\n")
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.stderr.write(f"reaper: prctl: {os.strerror(ctypes.get_errno())}\n")
        return 125
    command = argv[1:]
    child = os.fork()
    if child == 0:
        try:
            os.execvp(command[0], command)
        except OSError as e:
            sys.stderr.write(f"{command[0]}: {e.strerror}\n")
        os._exit(127)
    status = _wait_for(child)
    _kill_all_below(os.getpid())
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _wait_for(child: int) -> int:
    """Waits for `child`, reaping whatever else ends meanwhile (re-parented orphans)."""
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            return status


def _kill_all_below(me: int) -> None:
    """SIGKILLs every descendant until none is left. A process forking meanwhile leaves its
    child orphaned to us, so the next round finds it."""
    while True:
        for pid in descendants(me):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            return  # no child left, hence no descendant
        time.sleep(0.01)


def descendants(root: int) -> list[int]:
    """Every process below `root`, found through /proc (also used by process.py)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        parent = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(parent, []).append(int(entry))
    found, frontier = [], [root]
    while frontier:
        kids = children.get(frontier.pop(), [])
        found += kids
        frontier += kids
    return found


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
