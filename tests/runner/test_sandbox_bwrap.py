"""What only the bwrap kind does: a read-only root made of the host's /usr and an /etc made for
the sandbox (or a rootfs), with the rest of the host out of sight; run by the sandbox user, who
owns the workspace; mount sources it cannot look up come from a mirror."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rolltap.runner.sandboxes.base import Mount
from rolltap.runner.sandboxes.bwrap import BwrapProvider
from rolltap.runner.sandboxes.identity import sandbox_user
from tests.support.sandboxes import plain_task, provider_of, searchable, spec_for

ROOTFS = Path("/var/cache/rolltap/rootfs-bookworm")  # left by .ci/setup-docker


async def test_the_root_is_read_only_and_the_hosts_private_paths_are_absent(
    tmp_path: Path,
) -> None:
    secret = Path.home() / f".rolltap-test-secret-{tmp_path.name}"
    secret.write_text("host secret")
    try:
        async with provider_of("bwrap", tmp_path / "ws") as provider:
            box = await provider.create(spec_for(plain_task()))
            try:
                usr = await box.exec("touch /usr/x")
                home = await box.exec(f"cat {secret}")
                work = await box.exec(f"ls {Path(__file__).parent}")
                who = await box.exec("id -u; hostname")
            finally:
                await box.close()
    finally:
        secret.unlink()

    assert "Read-only file system" in usr.stderr
    assert home.exit_code != 0
    assert work.exit_code != 0
    assert who.stdout == "0\nsandbox\n"


async def test_a_rootfs_replaces_the_host_root_and_seeds_the_workdir(tmp_path: Path) -> None:
    if not (ROOTFS / "usr" / "bin" / "python3").exists():
        pytest.skip(f"no rootfs at {ROOTFS} (run .ci/setup-docker)")
    async with provider_of("bwrap", tmp_path / "ws"):
        pass  # skips when bwrap is missing
    provider = BwrapProvider(searchable(tmp_path / "ws"), rootfs=ROOTFS)
    box = await provider.create(spec_for(plain_task(workdir="/etc/apt")))
    try:
        release = await box.exec("cat /etc/debian_version")
        seeded = await box.exec("ls sources.list.d >/dev/null && touch mine && echo ok")
    finally:
        await provider.close()

    assert release.stdout.startswith("12.")
    assert seeded.stdout == "ok\n", seeded.stderr


async def test_etc_is_made_for_the_sandbox_and_the_tools_still_work(tmp_path: Path) -> None:
    probe = """
    ls /etc/shadow /etc/gshadow /etc/ssh /etc/ssl/private /etc/sudoers /opt /srv /home /var/lib
    cat /etc/passwd
    python3 -c 'import ssl; print(ssl.create_default_context().cert_store_stats()["x509_ca"] > 0)'
    cd /app && git init -q && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m x \
      && git log --format=%s
    """
    async with provider_of("bwrap", tmp_path / "ws") as provider:
        box = await provider.create(spec_for(plain_task()))
        try:
            result = await box.exec(probe)
        finally:
            await box.close()

    for gone in ("shadow", "gshadow", "ssh", "ssl/private", "sudoers", "/opt", "/srv", "/home"):
        assert f"{gone}': No such file or directory" in result.stderr, gone
    users = [line.split(":")[0] for line in result.stdout.splitlines() if ":x:" in line]
    assert users == ["root", "nobody"]
    assert result.stdout.endswith("True\nx\n"), result.stderr


async def test_the_workspace_belongs_to_the_sandbox_user(tmp_path: Path) -> None:
    user = sandbox_user()
    async with provider_of("bwrap", tmp_path / "ws") as provider:
        box = await provider.create(spec_for(plain_task()))
        try:
            src = tmp_path / "given.txt"
            src.write_text("from the runner\n")
            await box.put(src, "/app/given.txt")
            edited = await box.exec("echo edited >> given.txt && touch made.txt && ls -n")
            app = Path(box.workspace) / "fs" / "app"
            owners = {p.name: (p.stat().st_uid, p.stat().st_gid) for p in app.iterdir()}
        finally:
            await box.close()

    assert edited.ok, edited.stderr
    assert owners == {"given.txt": (user.uid, user.gid), "made.txt": (user.uid, user.gid)}


async def test_a_mount_the_sandbox_user_cannot_reach_comes_from_a_mirror(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("as a normal user every mount source is the runner's own to reach")
    hidden = tmp_path / "private"  # under pytest's 0700 directories
    (hidden / "bin").mkdir(parents=True)
    (hidden / "bin" / "tool").write_text("#!/bin/sh\necho tool ran\n")
    (hidden / "bin" / "tool").chmod(0o755)
    assert not sandbox_user().can_reach(hidden)
    async with provider_of("bwrap", tmp_path / "ws") as provider:
        box = await provider.create(spec_for(plain_task(), mounts=(Mount(hidden, str(hidden)),)))
        try:
            ran = await box.exec(f"{hidden}/bin/tool; touch {hidden}/bin/planted")
        finally:
            await box.close()

    assert ran.stdout == "tool ran\n"
    assert "Read-only file system" in ran.stderr
    assert sorted(p.name for p in (hidden / "bin").iterdir()) == ["tool"]
