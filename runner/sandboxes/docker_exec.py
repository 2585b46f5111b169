"""One command in a docker container (blocking, for a pool thread): output streamed from the
daemon's socket, and the kill of every process the command started."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path
from typing import Any

import docker
from docker.utils.socket import frames_iter

from .base import TIMEOUT_EXIT_CODE

EXEC_MARKER = "ROLLTAP_EXEC"
"""Set to a fresh token in each command's environment; its descendants inherit it."""

# $0 the token. Kills every process whose environment carries it, until none is left.
_KILL = f"""
t="{EXEC_MARKER}=$0"
for round in 1 2 3 4 5 6 7 8 9 10; do
  found=
  for d in /proc/[0-9]*; do
    if tr '\\0' '\\n' < "$d/environ" 2>/dev/null | grep -qxF "$t"; then
      kill -9 "${{d#/proc/}}" 2>/dev/null && found=1
    fi
  done
  [ -z "$found" ] && exit 0
  sleep 0.1
done
"""


class ContainerExec:
    def __init__(
        self, api: docker.APIClient, container_id: str, token: str, log: Path | None
    ) -> None:
        self._api = api
        self._container_id = container_id
        self._token = token
        self._log = log
        self._out = bytearray()
        self._err = bytearray()
        self._sock: Any = None
        self._user = ""
        self.exec_id: str | None = None

    @property
    def stdout(self) -> str:
        return self._out.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self._err.decode("utf-8", "replace")

    def run(self, argv: list[str], env: dict[str, str], cwd: str, user: str) -> int:
        """Runs argv to the end of its output; returns its exit status."""
        self._user = user
        created = self._api.exec_create(
            self._container_id, argv, stdout=True, stderr=True,
            environment={**env, EXEC_MARKER: self._token}, workdir=cwd, user=user,
        )  # fmt: skip
        self._sock = self._api.exec_start(created["Id"], socket=True)
        self.exec_id = str(created["Id"])
        with open(self._log, "ab") if self._log else contextlib.nullcontext() as sink:
            try:
                for stream, data in frames_iter(self._sock, tty=False):
                    (self._err if stream == 2 else self._out).extend(data)
                    if sink is not None:
                        sink.write(data)
                        sink.flush()
            except OSError:
                pass  # abandon() shut the socket down
        with contextlib.suppress(OSError):
            self._sock.close()
        return self.exit_code()

    def running(self) -> bool:
        return bool(self._api.exec_inspect(self.exec_id)["Running"])

    def exit_code(self) -> int:
        code = self._api.exec_inspect(self.exec_id)["ExitCode"]
        return TIMEOUT_EXIT_CODE if code is None else int(code)

    def kill(self) -> None:
        """SIGKILLs every process carrying this command's marker. It runs as the command's user:
        without capabilities only that user may read those processes' environments and kill
        them, and with no-new-privileges no process of the command can have become another."""
        kill_id = self._api.exec_create(
            self._container_id, ["sh", "-c", _KILL, self._token], user=self._user
        )
        self._api.exec_start(kill_id["Id"])

    def abandon(self) -> None:
        """Stops reading output (something the kill could not reach still holds it open)."""
        raw = getattr(self._sock, "_sock", self._sock)
        if raw is not None:
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_RDWR)
