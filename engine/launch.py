"""Run the engine as a child process: start it, wait until it serves, stop it; never orphan it.

The child gets the read end of a pipe whose write end only this process holds: when this
process dies for any reason the pipe reaches EOF and the child shuts itself down. (prctl's
PR_SET_PDEATHSIG would fire when the *thread* that forked exits, which breaks callers that start
engines from worker threads, as the async `astart` does.)
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from types import TracebackType
from typing import Any

from .errors import EngineStartError

_TAIL_CHARS = 4000

ANSWER_LIMITS = ("--default-max-tokens=256", "--max-tokens-cap=512")
"""What `rolltap serve`, `run` and `demo` give the built-in engine before the user's own
--engine-arg (the last of a flag wins): its default model is 135M parameters on a CPU, where an
unbounded answer rambles for minutes and a harness times out. A request's own max_tokens up to
the cap still applies."""


@dataclass
class EngineProcess:
    """A running engine child. `url` is its base URL (no /v1), `model` its served model name."""

    process: subprocess.Popen[bytes]
    url: str
    model: str
    port: int
    log_path: Path
    _workdir: Path
    _lifeline: int

    @classmethod
    def start(
        cls,
        model: str | None = None,
        device: str = "cpu",
        port: int = 0,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        timeout: float = 600.0,
        env: dict[str, str] | None = None,
    ) -> EngineProcess:
        """Start `rolltap model serve` and block until it reports ready (model loaded, warm).

        Raises EngineStartError, with the tail of the child's output, if the child exits or
        does not become ready within `timeout` seconds.
        """
        missing = [m for m in ("torch", "transformers", "gguf") if find_spec(m) is None]
        if missing:
            raise EngineStartError(
                f"the built-in engine needs {', '.join(missing)}: pip install 'rolltap[engine]' "
                "(on a CPU-only machine, pip install torch==2.13.0 first)"
            )
        workdir = Path(tempfile.mkdtemp(prefix="rolltap-engine-"))
        ready = workdir / "ready.json"
        log_path = workdir / "engine.log"
        lifeline_read, lifeline_write = os.pipe()
        # -P: `python -m` would put the working directory first on sys.path, and a folder named
        # `rolltap` there (the parent of a clone) would shadow the installed package.
        args = [sys.executable, "-P", "-m", "rolltap.engine"]
        if model is not None:
            args.append(model)
        args += ["--device", device, "--port", str(port), "--host", host]
        args += ["--ready-file", str(ready), "--parent-fd", str(lifeline_read), *extra_args]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(lifeline_read,),
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        os.close(lifeline_read)
        try:
            info = _wait_ready(process, ready, log_path, timeout)
        except BaseException:
            _terminate(process, 5.0)
            os.close(lifeline_write)
            raise
        return cls(
            process=process,
            url=str(info["url"]),
            model=str(info["model"]),
            port=int(info["port"]),
            log_path=log_path,
            _workdir=workdir,
            _lifeline=lifeline_write,
        )

    @classmethod
    async def astart(
        cls,
        model: str | None = None,
        device: str = "cpu",
        port: int = 0,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        timeout: float = 600.0,
        env: dict[str, str] | None = None,
    ) -> EngineProcess:
        """`start` in a worker thread, for async callers; same arguments."""
        return await asyncio.to_thread(
            cls.start, model, device, port, host, extra_args, timeout, env
        )

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds; idempotent."""
        _terminate(self.process, timeout)
        if self._lifeline >= 0:
            os.close(self._lifeline)
            self._lifeline = -1
            shutil.rmtree(self._workdir, ignore_errors=True)

    async def astop(self, timeout: float = 10.0) -> None:
        await asyncio.to_thread(self.stop, timeout)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _wait_ready(
    process: subprocess.Popen[bytes], ready: Path, log_path: Path, timeout: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        if ready.exists():
            info: dict[str, Any] = json.loads(ready.read_text())
            return info
        code = process.poll()
        if code is not None:
            raise EngineStartError(
                f"the engine exited with status {code} during startup:\n{_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            raise EngineStartError(
                f"the engine was not ready after {timeout:.0f}s:\n{_tail(log_path)}"
            )
        time.sleep(0.1)


def _terminate(process: subprocess.Popen[bytes], timeout: float) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no output)"
    return text[-_TAIL_CHARS:] or "(no output)"
