"""A proxy that listens beyond loopback must have an admin token: otherwise it does not start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from rolltap.proxy.control.admin import ExposedWithoutToken, check_exposure
from rolltap.store import Store
from tests.support.proxy import fake_engine, running_proxy

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.9.9.9", "::1", "localhost"])
def test_loopback_needs_no_token(host: str) -> None:
    check_exposure(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.1.2.3", "proxy.internal"])
def test_any_other_address_needs_a_token(host: str) -> None:
    with pytest.raises(ExposedWithoutToken, match="ROLLTAP_ADMIN_TOKEN"):
        check_exposure(host, None)
    check_exposure(host, "a-token")


def test_rolltap_serve_refuses_with_one_line_before_starting_anything(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'store.sqlite'}"
    done = subprocess.run(
        [sys.executable, "-m", "rolltap.cli.main", "serve", "--host", "0.0.0.0", "--db", db],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )

    assert done.returncode != 0
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert "--admin-token or ROLLTAP_ADMIN_TOKEN" in line
    assert "Traceback" not in done.stderr
    # No engine was started and no store was created for a proxy that could not run.
    assert not (tmp_path / "store.sqlite").exists()


async def test_the_proxy_itself_refuses_without_a_token(store: Store) -> None:
    async with fake_engine() as engine:
        with pytest.raises(ExposedWithoutToken):
            async with running_proxy(store, engine.url, host="0.0.0.0"):
                pass
        async with (
            running_proxy(store, engine.url, host="0.0.0.0", admin_token="t0ken") as proxy,
            aiohttp.ClientSession() as session,
        ):
            port = proxy.url.rsplit(":", 1)[1]
            async with session.get(f"http://127.0.0.1:{port}/admin/status") as resp:
                assert resp.status == 401
