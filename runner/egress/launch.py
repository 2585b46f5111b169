"""The runner's side of the egress gate: starts gate.py (one process per run), admits rollouts'
sandboxes to it, and writes what it reports into the store.

The CA's private key stays in a directory of the runner's own (mode 0700) that no sandbox
mounts; sandboxes get the bundle (the system's CAs plus the run's certificate) beside the
proxy socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import tempfile
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ...store import EgressRecord, EgressVerdict, Store
from ...store.ids import new_id
from ..sandboxes.base import EgressRoute
from .errors import EgressUnavailable
from .install import egress_python
from .settings import BUNDLE_NAME, EgressSettings

log = logging.getLogger("rolltap.runner.egress")

GATE = Path(__file__).with_name("gate.py")
SOCKET_NAME = "egress.sock"
SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")
FLUSH_EVERY = 0.2
START_TIMEOUT = 60.0
ACK_TIMEOUT = 10.0


class EgressGate:
    def __init__(
        self, process: asyncio.subprocess.Process, settings: EgressSettings, directory: Path
    ) -> None:
        self.settings = settings
        self.socket = directory / SOCKET_NAME
        self.bundle = directory / BUNDLE_NAME
        self._process = process
        self._acks: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._pending: list[EgressRecord] = []
        self._ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._reader: asyncio.Task[None] | None = None
        self._tokens: dict[str, str] = {}
        self.recorded = 0

    async def admit(
        self, rollout_id: str, key: str, allow: tuple[str, ...], *, intercept: bool
    ) -> EgressRoute:
        """Lets the rollout's sandbox through the gate (under `allow`), from when this returns."""
        token = secrets.token_urlsafe(24)
        message = {
            "op": "add",
            "token": token,
            "rollout": rollout_id,
            "key": key,
            "allow": list(allow),
            "intercept": intercept,
        }
        await self._send("added", token, message)
        self._tokens[rollout_id] = token
        return EgressRoute(self.socket, token)

    async def revoke(self, rollout_id: str) -> None:
        """New connections of the rollout's sandbox are refused (its harness has ended)."""
        token = self._tokens.pop(rollout_id, None)
        if token is not None:
            # A gate that is gone lets nobody through any more: nothing left to revoke.
            with contextlib.suppress(EgressUnavailable):
                await self._send("removed", token, {"op": "remove", "token": token})

    async def flush(self, store: Store) -> None:
        """Stores the requests recorded so far (the flusher does it every FLUSH_EVERY s)."""
        await _flush(self, store)

    def take_records(self) -> list[EgressRecord]:
        taken, self._pending = self._pending, []
        return taken

    async def _send(self, event: str, token: str, message: dict[str, Any]) -> None:
        stdin = self._process.stdin
        assert stdin is not None
        if self._reader is None or self._reader.done():
            status = self._process.returncode
            raise EgressUnavailable(f"the egress gate has exited (status {status})")
        done = asyncio.get_running_loop().create_future()
        self._acks[(event, token)] = done
        try:
            stdin.write(json.dumps(message).encode() + b"\n")
            await stdin.drain()
            await asyncio.wait_for(done, ACK_TIMEOUT)
        except (OSError, TimeoutError) as e:
            self._acks.pop((event, token), None)
            raise EgressUnavailable(f"the egress gate does not answer: {e!r}") from e

    async def _read(self) -> None:
        stdout = self._process.stdout
        assert stdout is not None
        while line := await stdout.readline():
            message = json.loads(line)
            event = message.get("event")
            if event == "request":
                self._pending.append(_record(message))
            elif event == "ready":
                self._ready.set_result(str(message["ca_cert"]))
            elif (event, message.get("token")) in self._acks:
                self._acks.pop((event, message["token"])).set_result(None)
        gone = EgressUnavailable("the egress gate has exited")
        if not self._ready.done():
            self._ready.set_exception(gone)
        for waiting in self._acks.values():
            if not waiting.done():
                waiting.set_exception(gone)
        self._acks.clear()


@contextlib.asynccontextmanager
async def egress_gate(
    settings: EgressSettings, *, directory: Path, proxy_socket: Path, store: Store
) -> AsyncIterator[EgressGate]:
    """Runs the gate for the duration of a run; its socket and CA bundle go into `directory`
    (the proxy socket's, which sandboxes mount). What it reports is written to the store as it
    comes and, at the end, before this returns."""
    python = egress_python()
    if not os.access(directory, os.W_OK):
        raise EgressUnavailable(
            f"the egress gate puts its socket beside the proxy's, and {directory} is not writable"
        )
    with tempfile.TemporaryDirectory(prefix="rolltap-egress-") as private:
        private_dir = Path(private)
        private_dir.chmod(0o700)
        config = {
            "confdir": str(private_dir / "ca"),
            "socket": str(directory / SOCKET_NAME),
            "socket_group": directory.stat().st_gid,
            "proxy_socket": str(proxy_socket),
            "intercept_hosts": list(settings.intercept_hosts),
            "resolve": dict(settings.resolve),
            "upstream_ca": str(settings.upstream_ca) if settings.upstream_ca else None,
            "ca_name": f"rolltap egress {datetime.now(UTC):%Y-%m-%d %H:%M:%S}",
        }
        (private_dir / "config.json").write_text(json.dumps(config))
        stderr = (private_dir / "gate.log").open("wb")
        process = await asyncio.create_subprocess_exec(
            str(python),
            "-E",
            "-s",
            str(GATE),
            str(private_dir / "config.json"),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )
        gate = EgressGate(process, settings, directory)
        gate._reader = asyncio.create_task(gate._read())
        flusher: asyncio.Task[None] | None = None
        try:
            try:
                ca_cert = await asyncio.wait_for(gate._ready, START_TIMEOUT)
            except (EgressUnavailable, TimeoutError) as e:
                lines = (private_dir / "gate.log").read_text(errors="replace").strip().splitlines()
                last = lines[-1] if lines else str(e) or type(e).__name__
                raise EgressUnavailable(f"the egress gate did not start: {last}") from e
            _write_bundle(Path(ca_cert), gate.bundle)
            flusher = asyncio.create_task(_flush_forever(gate, store))
            yield gate
        finally:
            if flusher is not None:
                flusher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await flusher
            await _stop(process)
            await gate._reader
            stderr.close()
            await _flush(gate, store)
            gate.socket.unlink(missing_ok=True)
            gate.bundle.unlink(missing_ok=True)


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.stdin is not None:
        process.stdin.close()
    try:
        await asyncio.wait_for(process.wait(), 10)
    except TimeoutError:
        process.kill()
        await process.wait()


async def _flush_forever(gate: EgressGate, store: Store) -> None:
    while True:
        await asyncio.sleep(FLUSH_EVERY)
        await _flush(gate, store)


async def _flush(gate: EgressGate, store: Store) -> None:
    records = gate.take_records()
    if records:
        await store.record_egress(records)
        gate.recorded += len(records)


def _record(message: dict[str, Any]) -> EgressRecord:
    return EgressRecord(
        id=new_id(),
        rollout_id=str(message["rollout"]),
        at=datetime.fromtimestamp(float(message["time"]), UTC),
        method=str(message["method"])[:16],
        host=str(message["host"])[:255],
        path=str(message["path"]),
        status=message["status"],
        request_bytes=int(message["request_bytes"]),
        response_bytes=int(message["response_bytes"]),
        verdict=EgressVerdict(message["verdict"]),
        reason=str(message["reason"]),
    )


def _write_bundle(ca_cert: Path, bundle: Path) -> None:
    """The system's CAs plus the run's certificate, readable by the sandboxes' group."""
    parts = [Path(p).read_bytes() for p in SYSTEM_BUNDLES if Path(p).is_file()][:1]
    parts.append(ca_cert.read_bytes())
    bundle.write_bytes(b"\n".join(p.rstrip(b"\n") for p in parts) + b"\n")
    bundle.chmod(0o644)
