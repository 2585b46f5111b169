"""An attacker inside each isolated sandbox kind, as that sandbox's root, behind the batch's real
proxy with a real store: it holds no capability, can neither remount nor write anything of the
host, and sees neither the store, nor the proxy's secret, nor the host's /etc/shadow.

(The local kind isolates nothing and is left out on purpose; the network is probed in
test_sandbox_isolation.py.)"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from rolltap.runner.host import proxy_host
from rolltap.runner.sandboxes.base import Mount, Sandbox
from tests.support.proxy import fake_engine
from tests.support.sandboxes import ISOLATED_KINDS, open_provider, plain_task, searchable, spec_for
from tests.support.stores import opened_store

HOST_DIR_INSIDE = "/mnt/host-data"
ROOT = "0"
"""exec(user=) as the image's root where a kind honours it (docker)."""


@dataclass
class Attacked:
    box: Sandbox
    host_dir: Path
    """A host directory mounted read-only inside at HOST_DIR_INSIDE, holding `data`."""
    store_file: Path
    secret_file: Path


@pytest_asyncio.fixture(params=ISOLATED_KINDS, loop_scope="function")
async def attacked(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Attacked]:
    provider = await open_provider(request.param, tmp_path / "ws")
    host_dir = searchable(tmp_path / "host")
    host_dir.chmod(0o755)  # readable by anyone, as a harness install is
    (host_dir / "data").write_text("host data\n")
    store_file = tmp_path / "store.sqlite"
    async with opened_store(f"sqlite:///{store_file}") as store:
        try:
            async with fake_engine() as engine, proxy_host(store, backends=[engine.url]) as host:
                spec = spec_for(
                    plain_task(),
                    proxy_socket=host.socket,
                    mounts=(Mount(host_dir, HOST_DIR_INSIDE),),
                )
                box = await provider.create(spec)
                try:
                    yield Attacked(box, host_dir, store_file, Path(f"{store_file}.secret"))
                finally:
                    await box.close()
        finally:
            await provider.close()


async def test_no_capability_is_left(attacked: Attacked) -> None:
    result = await attacked.box.exec(
        "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status", user=ROOT
    )

    caps = dict(line.split(":\t") for line in result.stdout.splitlines())
    assert set(caps) == {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}, result.stderr
    assert set(caps.values()) == {"0000000000000000"}, caps


async def test_host_paths_can_be_neither_remounted_nor_written(attacked: Attacked) -> None:
    inside = HOST_DIR_INSIDE
    usr_probe = Path(f"/usr/rolltap-planted-{secrets.token_hex(6)}")
    attack = f"""
    mount -o remount,bind,rw {inside}; touch {inside}/planted; echo more >> {inside}/data
    mount -o remount,bind,rw /usr; touch {usr_probe}
    mount -t tmpfs none {inside}; touch /run/rolltap/proxy/planted
    # A user namespace of its own holds every capability, over its own namespaces only.
    unshare -Urm sh -c 'mount -o remount,bind,rw {inside}; touch {inside}/planted-ns'
    ls {inside}
    """
    try:
        result = await attacked.box.exec(attack, user=ROOT)
        # Inside docker, /usr is the container's own: only the host's counts.
        usr_written = usr_probe.exists()
    finally:
        usr_probe.unlink(missing_ok=True)

    assert result.stdout.split() == ["data"], result.stderr
    assert sorted(p.name for p in attacked.host_dir.iterdir()) == ["data"]
    assert (attacked.host_dir / "data").read_text() == "host data\n"
    assert not usr_written
    assert "Read-only file system" in result.stderr or "Permission denied" in result.stderr


async def test_the_store_the_secret_and_the_hosts_shadow_are_out_of_sight(
    attacked: Attacked,
) -> None:
    secret = attacked.secret_file.read_text().strip()
    shadow = Path("/etc/shadow").read_text()
    store_dir = attacked.store_file.parent
    probe = f"""
    cat /etc/shadow
    ls {store_dir} {attacked.store_file} {attacked.secret_file} /var/run/docker.sock
    ls -a /run/rolltap/proxy
    grep -rIl {secret} /etc /root /run /tmp /app /logs /opt /var 2>/dev/null
    echo done
    """
    result = await attacked.box.exec(probe, user=ROOT)

    assert result.stdout.endswith("done\n"), result.stderr
    assert shadow.strip() not in result.stdout
    assert secret not in result.stdout
    # The proxy's directory holds its socket and nothing else.
    assert "proxy.sock" in result.stdout.split()
    for missing in (store_dir, attacked.store_file, attacked.secret_file, "docker.sock"):
        assert f"{missing}': No such file or directory" in result.stderr, missing


async def test_the_sandbox_sees_none_of_the_hosts_processes(attacked: Attacked) -> None:
    result = await attacked.box.exec("ls -d /proc/[0-9]* | wc -l")

    # Its own PID namespace: a handful of processes, where the host runs hundreds.
    assert 0 < int(result.stdout) < 20, result.stdout


# A runner that is not root, run as its own process: its bwrap sandboxes must hold no more than
# it does, and nothing of its own that it does not mount.
UNPRIVILEGED_RUNNER = """
import asyncio, json, site, sys
site.addsitedir(sys.argv[1])
from pathlib import Path
from rolltap.runner.sandboxes.base import Mount, SandboxSpec
from rolltap.runner.sandboxes.bwrap import BwrapProvider
from rolltap.runner.tasks import Task, TaskEnvironment

PROBES = {
    "caps": "grep -E '^Cap(Prm|Eff|Bnd)' /proc/self/status",
    "shadow": "cat /etc/shadow",
    "write": "mount -o remount,bind,rw /mnt/host-data; touch /mnt/host-data/planted;"
    " unshare -Urm sh -c 'mount -o remount,bind,rw /mnt/host-data; touch /mnt/host-data/x'",
    "own files": "ls " + sys.argv[3],
}

async def main() -> None:
    task = Task("plain", "-", Path("/"), "/app", TaskEnvironment())
    provider = BwrapProvider(Path(sys.argv[2]))
    mounts = (Mount(Path(sys.argv[4]), "/mnt/host-data"),)
    box = await provider.create(SandboxSpec(task, "run", "r1", mounts=mounts))
    found = {}
    for name, command in PROBES.items():
        result = await box.exec(command)
        found[name] = [result.exit_code, result.stdout, result.stderr]
    await box.close()
    await provider.close()
    print(json.dumps(found))

asyncio.run(main())
"""
RUNNER_UID = 61919


def test_a_runner_that_is_not_root_gives_its_sandboxes_nothing_more(tmp_path: Path) -> None:
    system = shutil.which("python3", path="/usr/bin")
    if os.geteuid() != 0 or system is None or shutil.which("bwrap") is None:
        pytest.skip("needs root (to become another user), /usr/bin/python3 and bwrap")
    version = subprocess.run(
        [system, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    ).stdout.strip()
    if version != str(sys.version_info[:2]):
        pytest.skip(f"/usr/bin/python3 is {version}: it cannot load this venv's packages")
    home = Path(tempfile.mkdtemp(prefix="rolltap-runner-", dir="/tmp"))
    try:
        for sub in ("ws", "private", "shared"):
            (home / sub).mkdir()
        (home / "private" / "secret").write_text("the runner's own\n")
        (home / "shared" / "data").write_text("host data\n")
        for path in (home, *home.iterdir(), *(home / "private").iterdir()):
            os.chown(path, RUNNER_UID, RUNNER_UID)
        done = subprocess.run(
            [system, "-I", "-c", UNPRIVILEGED_RUNNER, sysconfig.get_path("purelib"),
             str(home / "ws"), str(home / "private"), str(home / "shared")],
            user=RUNNER_UID, group=RUNNER_UID, extra_groups=[], cwd=home,
            env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        written = sorted(p.name for p in (home / "shared").iterdir())
    finally:
        shutil.rmtree(home)

    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    caps = dict(line.split(":\t") for line in found["caps"][1].splitlines())
    assert set(caps.values()) == {"0000000000000000"}, caps
    assert found["shadow"][0] != 0
    assert found["shadow"][1] == ""
    assert written == ["data"], found["write"]
    assert found["own files"][0] != 0, found["own files"]
