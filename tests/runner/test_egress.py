"""Controlled egress, for real: the mitmproxy gate process, a sandbox whose forwarder carries its
HTTP(S) proxy traffic, and HTTPS servers on loopback under made-up host names (the gate maps
them to the servers; inside the sandbox no name resolves and no address is reachable)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from rolltap.cli.main import cli
from rolltap.runner import run_batch
from rolltap.runner.egress import (
    EgressGate,
    EgressMode,
    EgressSettings,
    EgressUnavailable,
    egress_gate,
    sandbox_env,
)
from rolltap.runner.egress.settings import BUNDLE_NAME
from rolltap.runner.sandboxes.base import INSIDE_PROXY_DIR, Sandbox
from rolltap.runner.tasks import load_tasks
from rolltap.store import EgressRecord, EgressVerdict, NewRollout, Store
from tests.support.egress import (
    ALLOWED_HOST,
    DENIED_HOST,
    Upstream,
    https_upstream,
    make_pki,
    require_gate,
)
from tests.support.fake_harness import ShellHarness, cleanup, shell_installation
from tests.support.proxy import fake_engine
from tests.support.sandboxes import fake_proxy, plain_task, provider_of, spec_for
from tests.support.stores import opened_store

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


# Runs inside the sandbox with its own python3 and nothing but the environment rolltap sets.
CLIENT = r"""
import json, socket, sys, urllib.request, urllib.error
out = {}
def fetch(url, data=None):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=20) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, repr(e)
out["allowed"] = fetch("https://%(allowed)s/simple/numpy")
out["upload"] = fetch("https://%(allowed)s/upload", data=b"y" * 300000)
out["denied"] = fetch("https://%(denied)s/simple/answers")
out["loopback"] = fetch("https://127.0.0.2:%(port)d/simple/x")
import ssl
try:
    plain = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, trusting no CA at all
    urllib.request.urlopen("https://%(allowed)s/simple/untrusted", timeout=20, context=plain)
    out["untrusting"] = "fetched"
except OSError as e:
    out["untrusting"] = repr(e)
try:
    socket.getaddrinfo("%(allowed)s", 443)
    out["dns"] = "resolved"
except OSError as e:
    out["dns"] = repr(e)
try:
    socket.create_connection(("127.0.0.1", %(port)d), timeout=5)
    out["raw"] = "connected"
except OSError as e:
    out["raw"] = repr(e)
print(json.dumps(out))
"""


@dataclass
class Rig:
    store: Store
    gate: EgressGate
    port: int
    upstream: Upstream
    rollout_id: str
    key: str
    proxy_socket: Path


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    require_gate()
    pki = make_pki(tmp_path / "pki", (ALLOWED_HOST, DENIED_HOST))
    async with opened_store(f"sqlite:///{tmp_path / 'store.sqlite'}") as store:
        rollout = await store.create_rollout(NewRollout(task_id="egress"))
        async with https_upstream(pki) as (port, upstream), fake_proxy() as (sock, _):
            target = f"127.0.0.1:{port}"
            settings = EgressSettings(
                mode=EgressMode.ALLOWLIST,
                allow=(ALLOWED_HOST,),
                resolve={ALLOWED_HOST: target, DENIED_HOST: target},
                upstream_ca=pki.ca,
            )
            async with egress_gate(
                settings, directory=sock.parent, proxy_socket=sock, store=store
            ) as gate:
                yield Rig(store, gate, port, upstream, rollout.id, rollout.key, sock)


async def _run_client(box: Sandbox, rig: Rig) -> dict[str, object]:
    script = CLIENT % {"allowed": ALLOWED_HOST, "denied": DENIED_HOST, "port": rig.port}
    result = await box.exec(["python3", "-c", script], timeout=60)
    assert result.exit_code == 0, result.stderr
    return dict(json.loads(result.stdout))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bwrap", "docker"])
async def test_allowed_host_passes_denied_host_is_refused_and_both_are_recorded(
    rig: Rig, kind: str, tmp_path: Path
) -> None:
    # 127.0.0.2 is on the list, but the gate never reaches its own machine's addresses.
    allow = (ALLOWED_HOST, "127.0.0.2")
    route = await rig.gate.admit(rig.rollout_id, rig.key, allow, intercept=False)
    env = sandbox_env(f"{INSIDE_PROXY_DIR}/{BUNDLE_NAME}", route.port)
    spec = replace(spec_for(plain_task()), proxy_socket=rig.proxy_socket, egress=route, env=env)
    async with provider_of(kind, tmp_path / "ws") as provider:
        box = await provider.create(spec)
        try:
            seen = await _run_client(box, rig)
            keys = await box.exec(["grep", "-rl", "PRIVATE KEY", "/run/rolltap"])
            bundle = await box.exec(["grep", "-c", "BEGIN CERTIFICATE", env["SSL_CERT_FILE"]])
            await rig.gate.revoke(rig.rollout_id)
            after = await _run_client(box, rig)
        finally:
            await box.close()

    assert seen["allowed"] == [200, f"index of numpy at {ALLOWED_HOST}"]
    assert seen["upload"] == [200, "300000"]
    status, body = seen["denied"]  # type: ignore[misc]
    assert status == 403
    assert f"{DENIED_HOST} is not on this rollout's allow-list" in body
    status, body = seen["loopback"]  # type: ignore[misc]
    assert status == 403
    assert "resolves to 127.0.0.2, which is not a public address" in body
    assert "CERTIFICATE_VERIFY_FAILED" in str(seen["untrusting"])
    assert "resolved" not in str(seen["dns"])
    assert "connected" not in str(seen["raw"]), "a raw socket reached the host"
    assert rig.upstream.hits == [f"{ALLOWED_HOST} /simple/numpy"]
    assert keys.stdout == "", "the CA's private key is visible inside"
    assert int(bundle.stdout) > 1  # the system's CAs and the run's
    assert after["allowed"][0] != 200  # type: ignore[index]

    records = await _records(rig)
    by_path = {(r.host, r.path): r for r in records}
    allowed = by_path[(ALLOWED_HOST, "/simple/numpy")]
    assert (allowed.verdict, allowed.status, allowed.method) == (EgressVerdict.ALLOWED, 200, "GET")
    assert allowed.response_bytes == len(f"index of numpy at {ALLOWED_HOST}")
    upload = by_path[(ALLOWED_HOST, "/upload")]
    assert (upload.request_bytes, upload.method) == (300000, "POST")
    denied = by_path[(DENIED_HOST, "/simple/answers")]
    assert (denied.verdict, denied.status) == (EgressVerdict.DENIED, 403)
    assert "allow-list" in denied.reason
    loopback = by_path[("127.0.0.2", "/simple/x")]
    assert (loopback.verdict, loopback.status) == (EgressVerdict.DENIED, 403)
    untrusting = [r for r in records if r.method == "CONNECT"]
    assert [(r.host, r.verdict) for r in untrusting] == [(ALLOWED_HOST, EgressVerdict.DENIED)]
    assert "does it trust the egress CA?" in untrusting[0].reason
    assert len(records) == 5, records  # the revoked sandbox's attempts never reached mitmproxy


async def test_a_gate_that_died_is_a_clear_error_and_the_run_still_closes(rig: Rig) -> None:
    process = rig.gate._process
    process.kill()
    await process.wait()
    with pytest.raises(EgressUnavailable, match="the egress gate"):
        for _ in range(50):  # until its reader saw the end of its output
            await rig.gate.admit(rig.rollout_id, rig.key, (), intercept=False)
            await asyncio.sleep(0.05)
    await rig.gate.revoke(rig.rollout_id)  # nothing to revoke: no error either


async def test_a_gate_that_cannot_start_says_why_in_one_line(tmp_path: Path, store: Store) -> None:
    require_gate()
    directory = tmp_path / ("d" * 110)  # past what a unix socket's path may be
    directory.mkdir()
    settings = EgressSettings(mode=EgressMode.ALLOWLIST)
    with pytest.raises(EgressUnavailable) as caught:
        async with egress_gate(
            settings, directory=directory, proxy_socket=directory / "proxy.sock", store=store
        ):
            pass
    message = str(caught.value)
    assert message.startswith("the egress gate did not start: ")
    assert "path too long" in message
    assert "\n" not in message
    assert "Traceback" not in message


async def _records(rig: Rig) -> list[EgressRecord]:
    # The gate reports as it goes; the runner flushes every FLUSH_EVERY seconds.
    for _ in range(50):
        records = await rig.store.egress(rig.rollout_id)
        if len(records) >= 5:
            return records
        await asyncio.sleep(0.1)
    return await rig.store.egress(rig.rollout_id)


FETCH = (
    'python3 -c "import urllib.request, urllib.error\n'
    f"try: print(urllib.request.urlopen('https://{ALLOWED_HOST}/simple/x', timeout=20).status)\n"
    'except urllib.error.HTTPError as e: print(e.code)" > /logs/agent/fetch.txt;'
    " echo hello > hello.txt"
)


@pytest.mark.slow
async def test_a_batch_records_each_rollouts_egress_and_allow_internet_false_reaches_nothing(
    tmp_path: Path, store: Store
) -> None:
    require_gate()
    pki = make_pki(tmp_path / "pki", (ALLOWED_HOST,))
    example = next(t for t in load_tasks(EXAMPLES) if t.id == "hello-file")
    hello = replace(example, environment=replace(example.environment, allow_internet=True))
    offline = replace(
        hello, id="hello-offline", environment=replace(hello.environment, allow_internet=False)
    )
    installed = shell_installation()
    try:
        async with (
            https_upstream(pki) as (port, upstream),
            fake_engine() as engine,
            provider_of("bwrap", tmp_path / "boxes") as provider,
        ):
            result = await run_batch(
                [hello, offline],
                harness=ShellHarness(FETCH),
                installed=installed,
                harness_from="host",
                sandbox=provider,
                backends=[engine.url],
                store=store,
                logs_root=tmp_path / "logs",
                egress=EgressSettings(
                    mode=EgressMode.ALLOWLIST,
                    allow=(ALLOWED_HOST,),
                    resolve={ALLOWED_HOST: f"127.0.0.1:{port}"},
                    upstream_ca=pki.ca,
                ),
            )
    finally:
        cleanup(installed)

    by_task = {r.task_id: r for r in result.results}
    assert {t: r.reward for t, r in by_task.items()} == {"hello-file": 1.0, "hello-offline": 1.0}
    fetched = {
        t: (r.logs_dir / "agent" / "fetch.txt").read_text().strip() for t, r in by_task.items()
    }
    assert fetched == {"hello-file": "200", "hello-offline": "403"}
    assert upstream.hits == [f"{ALLOWED_HOST} /simple/x"]
    online = await store.egress(by_task["hello-file"].rollout_id)
    assert [(e.verdict, e.status, e.host) for e in online] == [
        (EgressVerdict.ALLOWED, 200, ALLOWED_HOST)
    ]
    denied = await store.egress(by_task["hello-offline"].rollout_id)
    assert [(e.verdict, e.status) for e in denied] == [(EgressVerdict.DENIED, 403)]
    assert "allow-list is empty" in denied[0].reason
    view = await store.rollout(by_task["hello-file"].rollout_id)
    assert view.meta["run"]["adapter"]["egress"] == {"mode": "allowlist", "allow": [ALLOWED_HOST]}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--egress", "allowlist", "--allow-host", "https://pypi.org/simple"], "host pattern"),
        (["--egress", "intercept", "--egress-config", "{bad}"], "egress config"),
    ],
)
def test_bad_egress_settings_are_one_line_errors(
    tmp_path: Path, args: list[str], message: str
) -> None:
    bad = tmp_path / "egress.toml"
    bad.write_text("allow = 'pypi.org'\n")
    argv = ["run", str(EXAMPLES / "hello-file"), "--harness", "oracle"]
    argv += [a.replace("{bad}", str(bad)) for a in args]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output
