"""The unprivileged host user that sandboxed processes run as.

A runner started as root must never hand root to the policy: inside a user namespace, uid 0
maps to whichever host uid started the namespace, so a bubblewrap started by root gives the
sandbox host root's ownership of every root-owned file (/etc/shadow among them). So when the
runner is root, the bwrap and apptainer kinds start as a dedicated unprivileged uid and gid
(61000 unless `ROLLTAP_SANDBOX_UID` / `ROLLTAP_SANDBOX_GID` say otherwise; it needs no passwd
entry), and the rollout's workspace is handed to it. A runner that is not root runs its
sandboxes as itself: it has nothing more to give away.

The proxy's unix socket is group-accessible to this gid and to nobody else (proxy/server.py).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SANDBOX_ID = 61000
"""Outside the ranges Debian allocates to people (1000-59999) and systemd's dynamic users
(61184-65519); any uid works, since a sandbox only sees what it mounts."""
UID_VARIABLE = "ROLLTAP_SANDBOX_UID"
GID_VARIABLE = "ROLLTAP_SANDBOX_GID"


@dataclass(frozen=True)
class SandboxUser:
    uid: int
    gid: int

    @property
    def switches(self) -> bool:
        """True when starting a sandbox means leaving this process's own uid (we are root)."""
        return self.uid != os.geteuid()

    def can_reach(self, path: Path) -> bool:
        """Whether this user may look up `path`: search permission on every directory above it.
        A bind source it cannot reach cannot be mounted by a sandbox running as it."""
        for parent in reversed(path.resolve().parents):
            try:
                st = parent.stat()
            except OSError:
                return False
            if not self._may(st, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
                return False
        return True

    def _may(self, st: os.stat_result, owner: int, group: int, other: int) -> bool:
        if st.st_uid == self.uid:
            return bool(st.st_mode & owner)
        if st.st_gid == self.gid:
            return bool(st.st_mode & group)
        return bool(st.st_mode & other)


def sandbox_user() -> SandboxUser:
    """The dedicated sandbox user when this process is root, else this process's own user."""
    if os.geteuid() != 0:
        return SandboxUser(os.getuid(), os.getgid())
    uid = _id_from(UID_VARIABLE, DEFAULT_SANDBOX_ID)
    gid = _id_from(GID_VARIABLE, uid)
    if uid == 0 or gid == 0:
        raise ValueError(
            f"{UID_VARIABLE} and {GID_VARIABLE} must not be 0: sandboxes never run as root"
        )
    return SandboxUser(uid, gid)


def _id_from(variable: str, default: int) -> int:
    value = os.environ.get(variable, "").strip()
    if not value:
        return default
    if not value.isdigit():
        raise ValueError(f"{variable}={value!r}: give a numeric id")
    return int(value)
