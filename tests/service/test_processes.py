"""The two ways to run the service: `rolltap serve --runner` (one process with the proxy) and
`python -m rolltap.runner.service` beside a proxy, each a real process driven by the client."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rolltap.client import Client, Group, ServiceError
from rolltap.runner.sandboxes.identity import sandbox_user
from tests.support.sandboxes import short_tmp_dir

TASKS = [{"id": "echo", "instruction": "say hi", "test": "test -s answer.txt"}]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _process(argv: list[str], ready: str, log: Path, env: dict[str, str]) -> Iterator[None]:
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while not _answers(ready):
            assert process.poll() is None, log.read_text()[-3000:]
            if time.monotonic() > deadline:
                pytest.fail(f"not ready: {log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _answers(url: str) -> bool:
    """The server answers HTTP at all (an error status counts: it is up)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


@pytest.fixture
def fake_engine_url(tmp_path: Path) -> Iterator[str]:
    port = _port()
    argv = [sys.executable, "-m", "tests.support.fake_vllm", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with _process(argv, f"{url}/health", tmp_path / "engine.log", dict(os.environ)):
        yield url


def test_serve_runner_serves_batches_and_weights_beside_the_proxy(
    tmp_path: Path, fake_engine_url: str
) -> None:
    port, token = _port(), secrets.token_hex(8)
    argv = [
        sys.executable,
        "-m",
        "rolltap.cli.main",
        "serve",
        "--runner",
        "--runner-sandboxes=bwrap",
        f"--port={port}",
        f"--backend={fake_engine_url}",
        f"--db=sqlite:///{tmp_path / 'store.sqlite'}",
        "--weight-version=0",
    ]
    env = {**os.environ, "ROLLTAP_ADMIN_TOKEN": token}
    url = f"http://127.0.0.1:{port}"
    with _process(argv, f"{url}/health", tmp_path / "serve.log", env):
        with Client(url, token=token) as client:
            batch = client.submit(TASKS, harness="single-call", samples_per_task=2)
            events = list(client.events(batch.id))
            (group,) = [e for e in events if isinstance(e, Group)] or [events[-1]]
            with client.weight_update("1"):
                pass
            weights = client.weights()
        with Client(url, token="wrong") as intruder, pytest.raises(ServiceError) as refused:
            intruder.batch(batch.id)

    assert group.rewards == [1.0, 1.0]
    assert all(s.min_version == "0" for s in group.samples)
    assert weights["weight_version"] == "1"
    assert refused.value.status == 401
    assert token not in (tmp_path / "serve.log").read_text()


def test_the_service_runs_as_its_own_process_beside_a_proxy(
    tmp_path: Path, fake_engine_url: str
) -> None:
    proxy_port, service_port, token = _port(), _port(), secrets.token_hex(8)
    socket_dir = short_tmp_dir()
    # The proxy's socket admits the sandboxes' group: its directory must let that group in.
    os.chown(socket_dir, -1, sandbox_user().gid)
    socket_dir.chmod(0o750)
    db = f"sqlite:///{tmp_path / 'store.sqlite'}"
    env = {**os.environ, "ROLLTAP_ADMIN_TOKEN": token}
    proxy = [
        sys.executable,
        "-m",
        "rolltap.cli.main",
        "serve",
        f"--port={proxy_port}",
        f"--backend={fake_engine_url}",
        f"--db={db}",
        f"--unix-socket={socket_dir / 'proxy.sock'}",
        "--weight-version=7",
    ]
    service = [
        sys.executable,
        "-m",
        "rolltap.runner.service",
        f"--proxy=http://127.0.0.1:{proxy_port}",
        f"--proxy-socket={socket_dir / 'proxy.sock'}",
        "--model=fake-model",
        f"--db={db}",
        f"--port={service_port}",
        "--sandboxes=bwrap",
    ]
    proxy_url, service_url = f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{service_port}"
    with (
        _process(proxy, f"{proxy_url}/health", tmp_path / "proxy.log", env),
        _process(
            service,
            f"{service_url}/v1/batches",
            tmp_path / "service.log",
            {**env, "ROLLTAP_ADMIN_TOKEN": token},
        ),
        Client(service_url, token=token) as client,
    ):
        batch = client.submit(TASKS, harness="single-call", samples_per_task=2)
        events = list(client.events(batch.id))
        (group,) = [e for e in events if isinstance(e, Group)] or [events[-1]]
        with client.weight_update("8"):
            pass
        weights = client.weights()

    assert group.rewards == [1.0, 1.0]
    assert all(s.min_version == "7" for s in group.samples)
    assert weights["weight_version"] == "8"
    assert weights["history"][-1] == {"version": "8", "epoch": 1}


def test_serve_runner_stopped_by_ctrl_c_leaves_no_socket_behind(
    tmp_path: Path, fake_engine_url: str
) -> None:
    """The sandboxes' unix socket and the private folder made for it go with the server: a
    socket file left behind names a server that is gone."""
    port, tmp = _port(), tmp_path / "tmp"
    tmp.mkdir()
    argv = [
        *(sys.executable, "-m", "rolltap.cli.main", "serve", "--runner"),
        *("--runner-sandboxes=bwrap", f"--port={port}", f"--backend={fake_engine_url}"),
        f"--db=sqlite:///{tmp_path / 'store.sqlite'}",
    ]
    env = {**os.environ, "TMPDIR": str(tmp), "ROLLTAP_ADMIN_TOKEN": secrets.token_hex(8)}
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while not _answers(f"http://127.0.0.1:{port}/health"):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        (shown,) = [
            line.split(": ", 1)[1]
            for line in log.read_text().splitlines()
            if line.strip().startswith("unix socket:")
        ]
        socket_path = Path(shown)
        assert socket_path.is_socket()
        assert socket_path.is_relative_to(tmp)
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not socket_path.exists()
    assert list(tmp.iterdir()) == [], log.read_text()
