"""What only the bwrap kind does: a read-only root made of the host's system directories (or a
rootfs), with the rest of the host out of sight."""

from __future__ import annotations

from pathlib import Path

import pytest

from rolltap.runner.sandboxes.bwrap import BwrapProvider
from tests.support.sandboxes import plain_task, provider_of, spec_for

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
    provider = BwrapProvider(tmp_path / "ws", rootfs=ROOTFS)
    box = await provider.create(spec_for(plain_task(workdir="/etc/apt")))
    try:
        release = await box.exec("cat /etc/debian_version")
        seeded = await box.exec("ls sources.list.d >/dev/null && touch mine && echo ok")
    finally:
        await provider.close()

    assert release.stdout.startswith("12.")
    assert seeded.stdout == "ok\n", seeded.stderr
